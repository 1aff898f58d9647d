// The communicator of one process group over NCCL (CUDA tensors).
#pragma once

#include <cuda_runtime_api.h>
#include <loom/sdk.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "plugins/comm_nccl/op_tracker.h"

namespace loom::comm_nccl {

/// One group's communicator: an initialised, non-blocking NCCL communicator on one device,
/// its own CUDA stream, and a watchdog thread.
///
/// Streams: every operation runs on the communicator's stream (non-blocking, highest
/// priority), ordered after the work already queued on the caller's stream: the `stream`
/// argument, or the device's compute stream (IHost::compute_stream) when it is null. A
/// synchronous call returns once the operation is queued and the caller's stream waits for
/// it (kernels queued after the call see the result); it does not wait for the GPU unless
/// the backend's option "blocking_wait" is set. An asynchronous call queues the same way;
/// its handle's wait() makes the caller's stream wait for it.
///
/// Failures: every operation has the timeout of set_timeout_ms (300000 ms by default),
/// counted from when it starts running on the GPU. The watchdog polls the events of the
/// pending operations and NCCL's asynchronous error; an operation that runs past its timeout
/// or an error aborts the NCCL communicator (ncclCommAbort, so no kernel waits for a dead
/// peer) and fails every pending operation: their handles' wait() return kDeadlineExceeded or
/// kAborted naming the operation and group, and the next call returns that failure, then
/// kFailedPrecondition. Queueing itself (NCCL connects to peers on first use) is bounded by
/// the same timeout. Bad arguments (kInvalidArgument) are found before anything is queued
/// and leave the communicator usable.
///
/// NCCL has no message tags: send and recv between two ranks match in the order they were
/// issued, whatever their tags.
///
/// Threading: issue calls from one thread at a time; wait() and done() may be called from
/// any. Destroying the communicator lets the pending operations finish (at most one timeout
/// long, then it aborts) and frees NCCL's resources; handles may outlive it.
class NcclCommunicator final : public Object<ICommunicator> {
 public:
  struct Config {
    std::string group_key;       ///< e.g. "tp/0", for messages
    int32_t rank = 0;            ///< this rank in the group
    int32_t size = 1;            ///< the group's size
    int32_t device = 0;          ///< the CUDA device the NCCL communicator was made on
    bool blocking_wait = false;  ///< sync calls and wait() also wait for the GPU
    IHost* host = nullptr;       ///< for the compute stream and logging; may be null
  };

  /// Takes `comm` (initialised on config.device). Throws Error(kInternal) when the stream or
  /// the barrier's buffer cannot be made; `comm` is then aborted.
  NcclCommunicator(Config config, ncclComm_t comm);
  ~NcclCommunicator() override;

  int32_t rank() const noexcept override { return config_.rank; }
  int32_t size() const noexcept override { return config_.size; }
  Status all_reduce(TensorView* tensor, ReduceOp op, void* stream) noexcept override;
  Status reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                        void* stream) noexcept override;
  Status all_gather(const TensorView* input, TensorView* output, void* stream) noexcept override;
  Status broadcast(TensorView* tensor, int32_t root, void* stream) noexcept override;
  /// Grouped ncclSend/ncclRecv per peer (zero counts skipped); this rank's own slice is a
  /// device-to-device copy on the communicator's stream.
  Status all_to_all(const TensorView* input, const int64_t* send_counts,
                    const int64_t* send_offsets, TensorView* output, const int64_t* recv_counts,
                    const int64_t* recv_offsets, void* stream) noexcept override;
  /// `tag` is not used (NCCL has none): sends and recvs between two ranks match in order.
  Status send(const TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  Status recv(TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  /// A one-element all-reduce after the work queued on the compute stream, waited for on the
  /// host: when it returns, every rank has reached the barrier.
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
  // The NCCL calls of one operation: queue them on `stream` and return NCCL's result.
  using Enqueue = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;

  // The shared path of every operation, after its argument checks: orders the
  // communicator's stream after the caller's, queues the NCCL calls (waiting, at most the
  // timeout, for the non-blocking communicator to finish queueing them), records the end and
  // hands the operation to the watchdog. A failure here leaves this rank out of step with the
  // others: it breaks the communicator and is thrown as Error.
  std::shared_ptr<OpRecord> issue(const std::string& what, void* stream, const Enqueue& enqueue);

  // The op bodies: check the arguments (throwing kInvalidArgument), then issue. Null when
  // there is nothing to move (no elements).
  std::shared_ptr<OpRecord> do_all_reduce(const TensorView* tensor, ReduceOp op, void* stream);
  std::shared_ptr<OpRecord> do_reduce_scatter(const TensorView* input, const TensorView* output,
                                              ReduceOp op, void* stream);
  std::shared_ptr<OpRecord> do_all_gather(const TensorView* input, const TensorView* output,
                                          void* stream);
  std::shared_ptr<OpRecord> do_broadcast(const TensorView* tensor, int32_t root, void* stream);
  std::shared_ptr<OpRecord> do_point_to_point(const TensorView* tensor, int32_t peer, bool is_send,
                                              void* stream);

  // A synchronous call: runs `body` (a do_*), then waits as a handle does (await_op; on the
  // host too when `blocking`).
  template <class Body>
  Status run_sync(Body&& body, bool blocking) noexcept;
  // An asynchronous call: runs `body` and hands out a handle (a finished one for bad
  // arguments, a refusal or nothing to move).
  template <class Body>
  Status run_async(const char* op, ICommWork** out, Body&& body) noexcept;
  // An operation with no elements queues nothing: null, or the refusal of a failed
  // communicator (thrown).
  std::shared_ptr<OpRecord> nothing_to_move(const std::string& what);

  // Polls NCCL until a call that returned ncclInProgress has finished queueing, at most
  // until `deadline`. Needs comm_mutex_.
  ncclResult_t settle(ncclResult_t result, Clock::time_point deadline);
  // Records `failure` as the communicator's, aborts NCCL and logs it. Needs comm_mutex_.
  void abort_locked(const Failure& failure, bool reported);
  void watchdog_loop() noexcept;
  // One watchdog round: retire, time out, check NCCL's asynchronous error.
  void watchdog_check();
  // The stream an operation issued against `stream` orders itself after.
  cudaStream_t caller_stream(void* stream) const;
  // "all_reduce on group 'dp/0' (rank 1 of 2)".
  std::string what(const char* op) const;
  void log(LogLevel level, const std::string& message) const noexcept;

  const Config config_;
  std::atomic<int64_t> timeout_ms_;

  std::mutex comm_mutex_;           // guards comm_: every NCCL call, abort and destroy
  ncclComm_t comm_;                 // null once aborted or destroyed
  cudaStream_t stream_ = nullptr;   // the communicator's stream
  void* barrier_buffer_ = nullptr;  // (1,) i32 on the device, for barrier()

  OpTracker tracker_;

  std::mutex watch_mutex_;
  std::condition_variable watch_wake_;
  bool stopping_ = false;
  std::thread watchdog_;  // last: starts once everything above is constructed
};

}  // namespace loom::comm_nccl
