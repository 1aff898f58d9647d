#include "core/parallel/device_dispatch_communicator.h"

#include <fmt/format.h>

#include <utility>

#include "loom/cpp/comm_work.h"
#include "loom/cpp/op_args.h"

namespace loom::core {

DeviceDispatchCommunicator::DeviceDispatchCommunicator(ICommunicator* host, ICommunicator* device,
                                                       DeviceType type, std::string key)
    : host_(host), device_(device), type_(type), key_(std::move(key)) {}

DeviceDispatchCommunicator::~DeviceDispatchCommunicator() {
  device_->destroy();
  host_->destroy();
}

ICommunicator* DeviceDispatchCommunicator::pick(const char* op, const TensorView* a,
                                                const TensorView* b, Status* error) noexcept {
  DeviceType t = a != nullptr ? a->device.type : DeviceType::kCpu;
  if (b != nullptr && a != nullptr && b->device.type != t) {
    std::string m = fmt::format(
        "{} on group '{}': input in {} memory and output in {} memory; both must be on one "
        "device (host tensors go over the CPU backend, {} tensors over the device backend)",
        op, key_, device_type_name(t), device_type_name(b->device.type), device_type_name(type_));
    *error = make_status(Code::kInvalidArgument, m.c_str(), m.size());
    return nullptr;
  }
  if (t == DeviceType::kCpu) return host_;
  if (t == type_) return device_;
  std::string m = fmt::format("{} on group '{}': no communicator for {} tensors in this run", op,
                              key_, device_type_name(t));
  *error = make_status(Code::kInvalidArgument, m.c_str(), m.size());
  return nullptr;
}

#define LOOM_DISPATCH(OP, A, B, CALL)        \
  Status error = ok_status();                \
  ICommunicator* c = pick(OP, A, B, &error); \
  if (c == nullptr) return error;            \
  return c->CALL

Status DeviceDispatchCommunicator::all_reduce(TensorView* tensor, ReduceOp op,
                                              void* stream) noexcept {
  LOOM_DISPATCH("all_reduce", tensor, nullptr, all_reduce(tensor, op, stream));
}
Status DeviceDispatchCommunicator::reduce_scatter(const TensorView* input, TensorView* output,
                                                  ReduceOp op, void* stream) noexcept {
  LOOM_DISPATCH("reduce_scatter", input, output, reduce_scatter(input, output, op, stream));
}
Status DeviceDispatchCommunicator::all_gather(const TensorView* input, TensorView* output,
                                              void* stream) noexcept {
  LOOM_DISPATCH("all_gather", input, output, all_gather(input, output, stream));
}
Status DeviceDispatchCommunicator::broadcast(TensorView* tensor, int32_t root,
                                             void* stream) noexcept {
  LOOM_DISPATCH("broadcast", tensor, nullptr, broadcast(tensor, root, stream));
}
Status DeviceDispatchCommunicator::all_to_all(const TensorView* input, const int64_t* send_counts,
                                              const int64_t* send_offsets, TensorView* output,
                                              const int64_t* recv_counts,
                                              const int64_t* recv_offsets, void* stream) noexcept {
  LOOM_DISPATCH(
      "all_to_all", input, output,
      all_to_all(input, send_counts, send_offsets, output, recv_counts, recv_offsets, stream));
}
Status DeviceDispatchCommunicator::send(const TensorView* tensor, int32_t peer, int32_t tag,
                                        void* stream) noexcept {
  LOOM_DISPATCH("send", tensor, nullptr, send(tensor, peer, tag, stream));
}
Status DeviceDispatchCommunicator::recv(TensorView* tensor, int32_t peer, int32_t tag,
                                        void* stream) noexcept {
  LOOM_DISPATCH("recv", tensor, nullptr, recv(tensor, peer, tag, stream));
}

Status DeviceDispatchCommunicator::barrier() noexcept {
  Status s = device_->barrier();
  if (s.code != Code::kOk) return s;
  return host_->barrier();
}

void DeviceDispatchCommunicator::set_timeout_ms(int64_t timeout_ms) noexcept {
  host_->set_timeout_ms(timeout_ms);
  device_->set_timeout_ms(timeout_ms);
}

// An inner communicator of version 1.0 has no *_async: it runs synchronously and hands
// back a finished handle.
#define LOOM_DISPATCH_ASYNC(OP, A, B, ASYNC_CALL, SYNC_CALL) \
  Status error = ok_status();                                \
  ICommunicator* c = pick(OP, A, B, &error);                 \
  if (c == nullptr) return error;                            \
  if (has_async(*c)) return c->ASYNC_CALL;                   \
  return completed_work(c->SYNC_CALL, out)

Status DeviceDispatchCommunicator::all_reduce_async(TensorView* tensor, ReduceOp op, void* stream,
                                                    ICommWork** out) noexcept {
  LOOM_DISPATCH_ASYNC("all_reduce", tensor, nullptr, all_reduce_async(tensor, op, stream, out),
                      all_reduce(tensor, op, stream));
}
Status DeviceDispatchCommunicator::reduce_scatter_async(const TensorView* input, TensorView* output,
                                                        ReduceOp op, void* stream,
                                                        ICommWork** out) noexcept {
  LOOM_DISPATCH_ASYNC("reduce_scatter", input, output,
                      reduce_scatter_async(input, output, op, stream, out),
                      reduce_scatter(input, output, op, stream));
}
Status DeviceDispatchCommunicator::all_gather_async(const TensorView* input, TensorView* output,
                                                    void* stream, ICommWork** out) noexcept {
  LOOM_DISPATCH_ASYNC("all_gather", input, output, all_gather_async(input, output, stream, out),
                      all_gather(input, output, stream));
}
Status DeviceDispatchCommunicator::broadcast_async(TensorView* tensor, int32_t root, void* stream,
                                                   ICommWork** out) noexcept {
  LOOM_DISPATCH_ASYNC("broadcast", tensor, nullptr, broadcast_async(tensor, root, stream, out),
                      broadcast(tensor, root, stream));
}
Status DeviceDispatchCommunicator::send_async(const TensorView* tensor, int32_t peer, int32_t tag,
                                              void* stream, ICommWork** out) noexcept {
  LOOM_DISPATCH_ASYNC("send", tensor, nullptr, send_async(tensor, peer, tag, stream, out),
                      send(tensor, peer, tag, stream));
}
Status DeviceDispatchCommunicator::recv_async(TensorView* tensor, int32_t peer, int32_t tag,
                                              void* stream, ICommWork** out) noexcept {
  LOOM_DISPATCH_ASYNC("recv", tensor, nullptr, recv_async(tensor, peer, tag, stream, out),
                      recv(tensor, peer, tag, stream));
}

#undef LOOM_DISPATCH
#undef LOOM_DISPATCH_ASYNC

}  // namespace loom::core
