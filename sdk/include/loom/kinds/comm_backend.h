// kinds::kCommBackend and ICommunicator: collectives and point-to-point between ranks
// (Gloo for CPU tensors, NCCL for CUDA tensors). Every operation has a timeout: a dead
// peer makes the others fail with kDeadlineExceeded or kAborted naming the rank and the
// operation, never hang.
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
