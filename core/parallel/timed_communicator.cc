#include "core/parallel/timed_communicator.h"

#include <atomic>
#include <chrono>
#include <string>
#include <utility>

#include "loom/cpp/comm_work.h"
#include "loom/cpp/tensor.h"

namespace loom::core {
namespace {
thread_local bool t_worker = false;
int64_t bytes_of(const TensorView* v) {
  return v != nullptr ? static_cast<int64_t>(nbytes(*v)) : 0;
}

// The wrapper's handle around the backend's: counts the waiting as blocked time.
class TimedWork final : public Object<ICommWork> {
 public:
  TimedWork(ICommWork* inner, CommStats& stats, std::string key, const char* op, int64_t bytes,
            std::chrono::steady_clock::time_point issued)
      : inner_(inner),
        stats_(stats),
        key_(std::move(key)),
        op_(op),
        bytes_(bytes),
        issued_(issued) {}
  ~TimedWork() override {
    if (!counted_.load()) {
      // ICommWork: destroying an unfinished handle waits, and that wait blocks too.
      Status status = wait();
      status_release(&status);
    }
    inner_->destroy();
  }

  Status wait() noexcept override {
    auto t0 = std::chrono::steady_clock::now();
    Status status = inner_->wait();
    double seconds = seconds_since(t0);
    try {
      if (!counted_.exchange(true)) stats_.add(key_, op_, bytes_, seconds_since(issued_));
      if (!t_worker) stats_.add_wait(seconds);
    } catch (...) {
      // Statistics never fail an operation.
    }
    return status;
  }
  bool done() noexcept override { return inner_->done(); }

 private:
  ICommWork* inner_;
  CommStats& stats_;
  std::string key_;
  const char* op_;
  int64_t bytes_;
  std::chrono::steady_clock::time_point issued_;
  std::atomic<bool> counted_{false};  // the operation's entry is in the statistics
};
}  // namespace

void TimedCommunicator::mark_worker_thread() { t_worker = true; }

template <class Call>
Status TimedCommunicator::timed(const char* op, int64_t bytes, Call&& call) noexcept {
  auto t0 = std::chrono::steady_clock::now();
  Status status = call();
  double seconds = seconds_since(t0);
  try {
    stats_.add(key_, op, bytes, seconds);
    if (!t_worker) stats_.add_wait(seconds);
  } catch (...) {
    // Statistics never fail an operation.
  }
  return status;
}

template <class Async, class Sync>
Status TimedCommunicator::timed_async(const char* op, int64_t bytes, ICommWork** out, Async&& async,
                                      Sync&& sync) noexcept {
  if (out == nullptr)
    return make_status(Code::kInvalidArgument,
                       (std::string(op) + "_async: the handle pointer `out` is null").c_str());
  *out = nullptr;
  if (!has_async(*inner_)) return completed_work(timed(op, bytes, sync), out);
  auto issued = std::chrono::steady_clock::now();
  ICommWork* inner_work = nullptr;
  Status status = async(&inner_work);
  if (status.code != Code::kOk) return status;
  try {
    *out = new TimedWork(inner_work, stats_, key_, op, bytes, issued);
    return ok_status();
  } catch (...) {
    inner_work->destroy();  // waits for the operation: its tensors are the caller's
    return make_status(Code::kResourceExhausted, "out of host memory");
  }
}

Status TimedCommunicator::all_reduce(TensorView* tensor, ReduceOp op, void* stream) noexcept {
  return timed("all_reduce", bytes_of(tensor),
               [&] { return inner_->all_reduce(tensor, op, stream); });
}

Status TimedCommunicator::reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                                         void* stream) noexcept {
  return timed("reduce_scatter", bytes_of(input),
               [&] { return inner_->reduce_scatter(input, output, op, stream); });
}

Status TimedCommunicator::all_gather(const TensorView* input, TensorView* output,
                                     void* stream) noexcept {
  return timed("all_gather", bytes_of(output),
               [&] { return inner_->all_gather(input, output, stream); });
}

Status TimedCommunicator::broadcast(TensorView* tensor, int32_t root, void* stream) noexcept {
  return timed("broadcast", bytes_of(tensor),
               [&] { return inner_->broadcast(tensor, root, stream); });
}

Status TimedCommunicator::all_to_all(const TensorView* input, const int64_t* send_counts,
                                     const int64_t* send_offsets, TensorView* output,
                                     const int64_t* recv_counts, const int64_t* recv_offsets,
                                     void* stream) noexcept {
  return timed("all_to_all", bytes_of(input), [&] {
    return inner_->all_to_all(input, send_counts, send_offsets, output, recv_counts, recv_offsets,
                              stream);
  });
}

Status TimedCommunicator::send(const TensorView* tensor, int32_t peer, int32_t tag,
                               void* stream) noexcept {
  return timed("send", bytes_of(tensor), [&] { return inner_->send(tensor, peer, tag, stream); });
}

Status TimedCommunicator::recv(TensorView* tensor, int32_t peer, int32_t tag,
                               void* stream) noexcept {
  return timed("recv", bytes_of(tensor), [&] { return inner_->recv(tensor, peer, tag, stream); });
}

Status TimedCommunicator::barrier() noexcept {
  return timed("barrier", 0, [&] { return inner_->barrier(); });
}

Status TimedCommunicator::all_reduce_async(TensorView* tensor, ReduceOp op, void* stream,
                                           ICommWork** out) noexcept {
  return timed_async(
      "all_reduce", bytes_of(tensor), out,
      [&](ICommWork** w) { return inner_->all_reduce_async(tensor, op, stream, w); },
      [&] { return inner_->all_reduce(tensor, op, stream); });
}

Status TimedCommunicator::reduce_scatter_async(const TensorView* input, TensorView* output,
                                               ReduceOp op, void* stream,
                                               ICommWork** out) noexcept {
  return timed_async(
      "reduce_scatter", bytes_of(input), out,
      [&](ICommWork** w) { return inner_->reduce_scatter_async(input, output, op, stream, w); },
      [&] { return inner_->reduce_scatter(input, output, op, stream); });
}

Status TimedCommunicator::all_gather_async(const TensorView* input, TensorView* output,
                                           void* stream, ICommWork** out) noexcept {
  return timed_async(
      "all_gather", bytes_of(output), out,
      [&](ICommWork** w) { return inner_->all_gather_async(input, output, stream, w); },
      [&] { return inner_->all_gather(input, output, stream); });
}

Status TimedCommunicator::broadcast_async(TensorView* tensor, int32_t root, void* stream,
                                          ICommWork** out) noexcept {
  return timed_async(
      "broadcast", bytes_of(tensor), out,
      [&](ICommWork** w) { return inner_->broadcast_async(tensor, root, stream, w); },
      [&] { return inner_->broadcast(tensor, root, stream); });
}

Status TimedCommunicator::send_async(const TensorView* tensor, int32_t peer, int32_t tag,
                                     void* stream, ICommWork** out) noexcept {
  return timed_async(
      "send", bytes_of(tensor), out,
      [&](ICommWork** w) { return inner_->send_async(tensor, peer, tag, stream, w); },
      [&] { return inner_->send(tensor, peer, tag, stream); });
}

Status TimedCommunicator::recv_async(TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                                     ICommWork** out) noexcept {
  return timed_async(
      "recv", bytes_of(tensor), out,
      [&](ICommWork** w) { return inner_->recv_async(tensor, peer, tag, stream, w); },
      [&] { return inner_->recv(tensor, peer, tag, stream); });
}

}  // namespace loom::core
