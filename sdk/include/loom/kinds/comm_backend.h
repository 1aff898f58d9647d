// kinds::kCommBackend and ICommunicator: collectives and point-to-point between ranks
// (Gloo for CPU tensors, NCCL for CUDA tensors). Every operation has a timeout: a dead
// peer makes the others fail with kDeadlineExceeded or kAborted naming the rank and the
// operation, never hang.
//
// Interface 1.1 appends asynchronous collectives (`*_async`) that return an ICommWork
// handle. A caller checks `interface_info().minor >= 1` before calling them (an older
// backend's object has no such methods); `loom/cpp/comm_work.h` has the check.
#pragma once

#include <stdint.h>

#include "loom/object.h"
#include "loom/status.h"
#include "loom/types.h"

namespace loom {

enum class ReduceOp : int32_t {
  kSum = 0,
  kAvg = 1,
  kMax = 2,
  kMin = 3,
};

/// The handle of one asynchronous operation (ICommunicator::*_async). The caller owns it
/// and destroys it with IObject::destroy; destroying a handle whose operation has not
/// finished first waits for it (the tensors stay in use until then). A handle may outlive
/// its communicator; destroying the communicator fails the operations that have not
/// started with kAborted and waits for the running one.
class ICommWork : public IObject {
 public:
  /// Blocks until the operation has finished and returns its status: the codes and
  /// messages of the synchronous call (kDeadlineExceeded after the timeout, kAborted when
  /// a peer went away, kInvalidArgument for bad arguments, kFailedPrecondition after an
  /// earlier failure of the communicator). Calling it again returns the same status.
  virtual Status wait() noexcept = 0;
  /// Whether the operation has finished (wait() would not block). Never blocks.
  virtual bool done() noexcept = 0;

 protected:
  ~ICommWork() = default;
};

/// A communicator over one process group. All calls are collective over the group unless
/// stated. `stream` is the device stream for device tensors (null on the CPU).
class ICommunicator : public IObject {
 public:
  /// This rank within the group.
  virtual int32_t rank() const noexcept = 0;
  /// Number of ranks in the group.
  virtual int32_t size() const noexcept = 0;
  /// In place: every rank ends with the reduction of all ranks' `tensor`.
  virtual Status all_reduce(TensorView* tensor, ReduceOp op, void* stream) noexcept = 0;
  /// input (size * n) -> output (n): rank r gets the reduction of chunk r.
  virtual Status reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                                void* stream) noexcept = 0;
  /// input (n) -> output (size * n), chunk r from rank r.
  virtual Status all_gather(const TensorView* input, TensorView* output, void* stream) noexcept = 0;
  /// In place from `root` to every rank.
  virtual Status broadcast(TensorView* tensor, int32_t root, void* stream) noexcept = 0;
  /// Rank r sends send_counts[p] elements (from send_offsets[p]) to p and receives
  /// recv_counts[p] elements at recv_offsets[p]; counts in elements of the flat tensors.
  virtual Status all_to_all(const TensorView* input, const int64_t* send_counts,
                            const int64_t* send_offsets, TensorView* output,
                            const int64_t* recv_counts, const int64_t* recv_offsets,
                            void* stream) noexcept = 0;
  /// Point-to-point: not collective.
  virtual Status send(const TensorView* tensor, int32_t peer, int32_t tag,
                      void* stream) noexcept = 0;
  virtual Status recv(TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept = 0;
  virtual Status barrier() noexcept = 0;
  /// Timeout of every operation, in milliseconds.
  virtual void set_timeout_ms(int64_t timeout_ms) noexcept = 0;

  // Interface 1.1: asynchronous operations. Each takes the arguments of its synchronous
  // namesake and returns at once with `*out` set to a handle the caller owns (a call that
  // cannot even be queued returns its failure and leaves `*out` null). The operation's own
  // result, bad arguments included, comes from ICommWork::wait().
  //
  // Order: the operations of one communicator, synchronous and asynchronous, run one at a
  // time in the order they were issued, so collectives (async or not) must be issued in
  // the same order on every rank, and a synchronous call issued after asynchronous ones
  // runs after them. The memory of the tensors must stay alive and must not be read or
  // written until wait() returns; the TensorView structs themselves are read during the
  // call and may be temporaries. (all_to_all and barrier have no asynchronous form.)
  // Issue calls from one thread at a time; wait() and done() may be called from any.

  /// all_reduce, asynchronously.
  virtual Status all_reduce_async(TensorView* tensor, ReduceOp op, void* stream,
                                  ICommWork** out) noexcept = 0;
  /// reduce_scatter, asynchronously.
  virtual Status reduce_scatter_async(const TensorView* input, TensorView* output, ReduceOp op,
                                      void* stream, ICommWork** out) noexcept = 0;
  /// all_gather, asynchronously.
  virtual Status all_gather_async(const TensorView* input, TensorView* output, void* stream,
                                  ICommWork** out) noexcept = 0;
  /// broadcast, asynchronously.
  virtual Status broadcast_async(TensorView* tensor, int32_t root, void* stream,
                                 ICommWork** out) noexcept = 0;
  /// send, asynchronously (point-to-point). It is issued in order with everything else, and
  /// it may complete only once the peer's recv is posted.
  ///
  /// Pipeline parallelism (the core's schedule executor) needs more of send_async and
  /// recv_async than issue order: both return once the transfer is posted, without waiting
  /// for the peer, and a posted send or receive that waits for its peer must not hold up the
  /// transfers and collectives issued after it (transfers match by peer and tag, not by
  /// position). The executor posts each receive ahead of the action that needs its data
  /// and keeps sends in flight while it computes; stages send and receive in both
  /// directions at once. comm_gloo does this (a thread per transfer in flight); a backend
  /// whose point-to-point calls block, or run strictly one after another, deadlocks
  /// pipelines.
  virtual Status send_async(const TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                            ICommWork** out) noexcept = 0;
  /// recv, asynchronously (point-to-point; in issue order with everything else).
  virtual Status recv_async(TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                            ICommWork** out) noexcept = 0;

 protected:
  ~ICommunicator() = default;
};

/// A key-value store all ranks share for rendezvous (file system directory or Redis).
class IRendezvousStore {
 public:
  virtual Status set(StringView key, const void* value, uint64_t size) noexcept = 0;
  /// Blocks until `key` exists or the timeout passes; copies at most `capacity` bytes.
  virtual Status get(StringView key, void* value, uint64_t capacity, uint64_t* size,
                     int64_t timeout_ms) noexcept = 0;

 protected:
  ~IRendezvousStore() = default;
};

/// Creates communicators for the process groups of the grid.
class ICommBackend : public IObject {
 public:
  /// Creates the communicator of one group.
  /// \param store       shared rendezvous store (keys are prefixed with `group_key`)
  /// \param group_key   unique name of the group, e.g. "tp/3"
  /// \param rank, size  this rank in the group and the group's size
  /// \param device      the device family this communicator serves
  /// \param[out] out    the communicator; the caller owns it
  virtual Status create_communicator(IRendezvousStore* store, StringView group_key, int32_t rank,
                                     int32_t size, DeviceType device,
                                     ICommunicator** out) noexcept = 0;

 protected:
  ~ICommBackend() = default;
};

}  // namespace loom
