// TimedCommunicator: the core's wrapper around a backend's communicator. Modules and the
// trainer only ever see this wrapper: it counts each operation's time and bytes in
// CommStats (calls made on the training thread count as blocked time) and owns the
// backend's object.
//
// Asynchronous calls go to the backend's own when it has them (communicator 1.1); their
// handles count the time spent in wait() (or in destroying an unwaited handle) on the
// training thread as blocked, and the operation's entry gets the time from issue to the
// end of the first wait. A 1.0 backend has no asynchronous calls: the operation runs at
// once, timed as a synchronous call, and the handle returned is already finished.
#pragma once

#include <string>

#include "core/parallel/comm_stats.h"
#include "loom/cpp/object.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

class TimedCommunicator final : public Object<ICommunicator> {
 public:
  /// \param inner  the backend's communicator; owned (destroyed with this wrapper)
  /// \param key    the group's key ("tp/0"), for the statistics
  /// \param stats  where time is counted; must outlive this object
  TimedCommunicator(ICommunicator* inner, std::string key, CommStats& stats)
      : inner_(inner), key_(std::move(key)), stats_(stats) {}
  ~TimedCommunicator() override { inner_->destroy(); }

  /// Marks the calling thread as a communication worker: its calls are not blocked time.
  static void mark_worker_thread();

  int32_t rank() const noexcept override { return inner_->rank(); }
  int32_t size() const noexcept override { return inner_->size(); }
  Status all_reduce(TensorView* tensor, ReduceOp op, void* stream) noexcept override;
  Status reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                        void* stream) noexcept override;
  Status all_gather(const TensorView* input, TensorView* output, void* stream) noexcept override;
  Status broadcast(TensorView* tensor, int32_t root, void* stream) noexcept override;
  Status all_to_all(const TensorView* input, const int64_t* send_counts,
                    const int64_t* send_offsets, TensorView* output, const int64_t* recv_counts,
                    const int64_t* recv_offsets, void* stream) noexcept override;
  Status send(const TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  Status recv(TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  Status barrier() noexcept override;
  void set_timeout_ms(int64_t timeout_ms) noexcept override { inner_->set_timeout_ms(timeout_ms); }

  /// The handles refer to the CommStats given to the constructor: destroy them first.
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
  template <class Call>
  Status timed(const char* op, int64_t bytes, Call&& call) noexcept;
  // `async(ICommWork**)` issues on the inner communicator; `sync()` is the fallback for a
  // 1.0 one.
  template <class Async, class Sync>
  Status timed_async(const char* op, int64_t bytes, ICommWork** out, Async&& async,
                     Sync&& sync) noexcept;
  ICommunicator* inner_;
  std::string key_;
  CommStats& stats_;
};

}  // namespace loom::core
