// The communicator of one process group over Gloo (CPU tensors).
#pragma once

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <loom/cpp/comm_work.h>
#include <loom/sdk.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plugins/comm_gloo/failure.h"

namespace loom::comm_gloo {

/// One group's communicator: gloo collectives over a full mesh of TCP pairs, plus a ring
/// reduce-scatter (gloo 0.5's new-style API has none) and tagged send/recv over unbound
/// buffers.
///
/// Tensors are contiguous CPU views. Every operation waits at most the timeout
/// (set_timeout_ms, 300000 ms by default) in total. A failed operation (timeout, peer gone,
/// ranks disagreeing) closes this rank's connections, so the other ranks of the group fail
/// at once instead of waiting for their own timeouts, and leaves the communicator
/// unusable: every later call returns kFailedPrecondition. Bad arguments (kInvalidArgument)
/// are found before anything is sent and leave it usable.
///
/// Threading: a gloo context must not be used by two threads at once, so every operation,
/// synchronous or not, runs on the communicator's own worker thread in the order it was
/// issued: an asynchronous call queues the operation and returns a handle, a synchronous
/// one queues it and waits. Issue calls from one thread at a time; handles may be waited
/// on from any thread. Different communicators, even of one backend, run concurrently.
/// Collectives must be issued in the same order on every rank of the group.
///
/// Destroying the communicator fails the operations still queued with kAborted, waits for
/// the running one and then closes the connections.
class GlooCommunicator final : public Object<ICommunicator> {
 public:
  /// \param group_key       the group's name, for messages
  /// \param rank, size      this rank in the group and the group's size
  /// \param context         the connected gloo context; null when size == 1
  /// \param peer_addresses  per rank, the text of the address gloo names that peer by in
  ///                        its errors ("[10.0.0.2]:4321"); empty for this rank
  GlooCommunicator(std::string group_key, int32_t rank, int32_t size,
                   std::shared_ptr<gloo::Context> context, std::vector<std::string> peer_addresses);
  ~GlooCommunicator() override;

  int32_t rank() const noexcept override { return rank_; }
  int32_t size() const noexcept override { return size_; }
  Status all_reduce(TensorView* tensor, ReduceOp op, void* stream) noexcept override;
  Status reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                        void* stream) noexcept override;
  Status all_gather(const TensorView* input, TensorView* output, void* stream) noexcept override;
  Status broadcast(TensorView* tensor, int32_t root, void* stream) noexcept override;
  Status all_to_all(const TensorView* input, const int64_t* send_counts,
                    const int64_t* send_offsets, TensorView* output, const int64_t* recv_counts,
                    const int64_t* recv_offsets, void* stream) noexcept override;
  /// Tagged send to `peer`: matches the recv(peer = this rank, same tag) there. Messages of
  /// one (peer, tag) arrive in order. Blocks until the data is handed to the transport.
  Status send(const TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  Status recv(TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  Status barrier() noexcept override;
  /// Timeout of every operation issued after this call (values < 1 ms are taken as 1 ms).
  void set_timeout_ms(int64_t timeout_ms) noexcept override;

  Status all_reduce_async(TensorView* tensor, ReduceOp op, void* stream,
                          ICommWork** out) noexcept override;
  Status reduce_scatter_async(const TensorView* input, TensorView* output, ReduceOp op,
                              void* stream, ICommWork** out) noexcept override;
  Status all_gather_async(const TensorView* input, TensorView* output, void* stream,
                          ICommWork** out) noexcept override;
  Status broadcast_async(TensorView* tensor, int32_t root, void* stream,
                         ICommWork** out) noexcept override;
  Status send_async(const TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                    ICommWork** out) noexcept override;
  Status recv_async(TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                    ICommWork** out) noexcept override;

 private:
  // One queued operation: `body` runs it (through run()) and returns its status.
  struct Task {
    const char* op;
    std::function<Status()> body;
    int64_t timeout_ms;  // the timeout in force when it was issued
    std::shared_ptr<WorkCompletion> completion;
  };
  // Queues `body` as operation `op` and returns its completion; null when out of memory.
  template <class Body>
  std::shared_ptr<WorkCompletion> submit(const char* op, int32_t peer, Body body) noexcept;
  // Waits for a submitted operation: what a synchronous call returns.
  static Status await(const std::shared_ptr<WorkCompletion>& completion) noexcept;
  // Hands a submitted operation out as a handle.
  static Status hand_out(std::shared_ptr<WorkCompletion> completion, ICommWork** out) noexcept;
  // The operations both forms share; the views are copied, so the caller's TensorView
  // structs may go away once the call returns (the memory they point at may not).
  std::shared_ptr<WorkCompletion> issue_all_reduce(TensorView* tensor, ReduceOp op) noexcept;
  std::shared_ptr<WorkCompletion> issue_reduce_scatter(const TensorView* input, TensorView* output,
                                                       ReduceOp op) noexcept;
  std::shared_ptr<WorkCompletion> issue_all_gather(const TensorView* input,
                                                   TensorView* output) noexcept;
  std::shared_ptr<WorkCompletion> issue_broadcast(TensorView* tensor, int32_t root) noexcept;
  // A send or receive is posted by the worker, which goes on at once; its completion is
  // waited for on a thread of its own (send_waiters_), so a transfer whose peer is not
  // ready yet never holds up the transfers and collectives queued after it (a pipeline's
  // stages send and receive in both directions, and post receives ahead). Null when out of
  // memory.
  CommWorkPtr issue_transfer(const TensorView* tensor, int32_t peer, int32_t tag,
                             bool is_send) noexcept;
  // Waits for `buffer`'s send (or receive) on a new thread and finishes `done` with the
  // outcome.
  void wait_for_transfer(std::shared_ptr<gloo::transport::UnboundBuffer> buffer, bool is_send,
                         std::shared_ptr<WorkCompletion> done, std::string desc, int32_t peer);
  // A transport failure of operation `desc` (started at `start`, with `peer` or -1):
  // classified, recorded as the communicator's failure, and the connections closed so that
  // the peers stop now. Any thread.
  Failure transport_failed(std::exception_ptr error, const std::string& desc, int64_t timeout_ms,
                           std::chrono::steady_clock::time_point start, int32_t peer);
  // The first failure's message (any thread), or "" while usable; and recording one.
  std::string failure() const;
  void record_failure(const std::string& message);
  void worker_loop() noexcept;

  // Runs `body` as operation `op`: checks the communicator is usable, converts exceptions
  // to a status and, on a transport failure, breaks the communicator.
  template <class Body>
  Status run(const char* op, int32_t peer, Body&& body) noexcept;
  // "all_reduce on group 'dp/0' (rank 1 of 2)".
  std::string what(const char* op) const;
  // A fresh tag for a gloo collective; every rank draws the same sequence because
  // collectives run in the same order everywhere.
  uint32_t next_tag() { return next_tag_++; }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_); }
  void ring_reduce_scatter(const TensorView& input, TensorView& output, ReduceOp op,
                           const std::string& what);

  std::string group_key_;
  int32_t rank_;
  int32_t size_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<std::string> peer_addresses_;
  // Used on the worker thread only.
  int64_t timeout_ms_;
  uint32_t next_tag_ = 0;
  mutable std::mutex failure_mutex_;
  std::string failure_;  // the first failure's message; empty while usable (failure_mutex_)
  // Threads waiting for sends and receives to complete, each with its "finished" flag (joined when
  // finished, when a new one starts, and all in the destructor).
  struct SendWaiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::mutex send_waiters_mutex_;
  std::vector<SendWaiter> send_waiters_;

  std::mutex queue_mutex_;
  std::condition_variable queue_changed_;
  std::deque<Task> queue_;    // issued, not started
  int64_t issue_timeout_ms_;  // set_timeout_ms's value, given to each task issued
  bool stopping_ = false;     // set by the destructor
  std::thread worker_;        // last: starts once everything above is constructed
};

}  // namespace loom::comm_gloo
