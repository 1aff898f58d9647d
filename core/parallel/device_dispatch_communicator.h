// DeviceDispatchCommunicator: one process group served by two backends, the CPU's (Gloo)
// for host tensors and the device's (NCCL) for device tensors, so that a GPU run reduces
// its gradients over NCCL while the trainer's host scalars (loss, gradient-norm partial
// sums, checkpoint agreement) still go over Gloo. Each call goes to the communicator of its
// tensors' device; a call mixing host and device tensors is refused with a message.
#pragma once

#include <string>

#include "loom/cpp/object.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

class DeviceDispatchCommunicator final : public Object<ICommunicator> {
 public:
  /// \param host    the group's communicator for CPU tensors; owned
  /// \param device  the same group's communicator for tensors on `type`; owned
  /// \param type    the device family `device` serves (not the CPU)
  /// \param key     the group's key ("dp/0"), for messages
  DeviceDispatchCommunicator(ICommunicator* host, ICommunicator* device, DeviceType type,
                             std::string key);
  ~DeviceDispatchCommunicator() override;

  int32_t rank() const noexcept override { return host_->rank(); }
  int32_t size() const noexcept override { return host_->size(); }
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
  /// Host and device both: whatever either has in flight is ordered before it returns.
  Status barrier() noexcept override;
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
  // The communicator for a call on `a` (and `b`, when given), or null with `*error` set.
  ICommunicator* pick(const char* op, const TensorView* a, const TensorView* b,
                      Status* error) noexcept;

  ICommunicator* host_;
  ICommunicator* device_;
  DeviceType type_;
  std::string key_;
};

}  // namespace loom::core
