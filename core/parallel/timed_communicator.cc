#include "core/parallel/timed_communicator.h"

#include <chrono>

#include "loom/cpp/tensor.h"

namespace loom::core {
namespace {
thread_local bool t_worker = false;
int64_t bytes_of(const TensorView* v) {
  return v != nullptr ? static_cast<int64_t>(nbytes(*v)) : 0;
}
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

}  // namespace loom::core
