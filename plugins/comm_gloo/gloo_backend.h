// comm_backend "gloo": makes the communicators of a run's CPU process groups.
#pragma once

#include <gloo/transport/device.h>
#include <loom/sdk.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::comm_gloo {

/// Options (manifest "gloo"): hostname ("": this machine's hostname if it resolves to a
/// non-loopback address, else 127.0.0.1) or interface ("": unset), not both.
///
/// One gloo TCP device (an epoll loop thread and the listening address) per backend,
/// made at the first communicator of more than one rank and shared by all communicators
/// of this backend; each communicator has its own gloo context and full mesh of pairs.
/// create_communicator may be called from several threads.
class GlooBackend final : public Object<ICommBackend> {
 public:
  /// Throws kInvalidArgument ("/interface: ...") when both hostname and interface are set.
  GlooBackend(const nlohmann::json& options, IBuildContext& ctx);

  /// Connects `size` ranks through `store` under `group_key` (keys "<group_key>/gloo/...").
  /// A size-1 group needs no store, network or peer. Waits up to 300 s for the other ranks
  /// (kDeadlineExceeded naming the group after that). Only DeviceType::kCpu: CUDA gives
  /// kUnimplemented (CUDA tensors go over comm_nccl).
  Status create_communicator(IRendezvousStore* store, StringView group_key, int32_t rank,
                             int32_t size, DeviceType device,
                             ICommunicator** out) noexcept override;

 private:
  // The shared TCP device, made on first use (thread-safe).
  std::shared_ptr<gloo::transport::Device> device();

  std::string hostname_;
  std::string interface_;
  std::mutex mutex_;
  std::shared_ptr<gloo::transport::Device> device_;
};

}  // namespace loom::comm_gloo
