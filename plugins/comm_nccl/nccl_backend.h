// comm_backend "nccl": makes the communicators of a run's CUDA process groups.
#pragma once

#include <loom/sdk.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::comm_nccl {

/// Options (manifest "nccl"): blocking_wait (false: synchronous calls and wait() only order
/// the caller's stream after the operation; true: they also wait on the host until it has
/// finished on the GPU, returning its real status).
///
/// Each group gets its own NCCL communicator, made with ncclCommInitRankConfig from a unique
/// id that rank 0 of the group draws (ncclGetUniqueId) and publishes through the rendezvous
/// store the core hands to create_communicator (the store comm_gloo connects through).
/// ncclCommSplit from a world communicator would need every rank of the world to take part
/// in each split at once, but the core makes a group's communicator only on that group's
/// ranks, when first used; a unique id per group needs only the group's own ranks.
///
/// The communicator is made on the calling thread's current CUDA device, non-blocking
/// (config.blocking = 0) so that joining, queueing and teardown can all be bounded by a
/// timeout and aborted. create_communicator may be called from several threads.
class NcclBackend final : public Object<ICommBackend> {
 public:
  NcclBackend(const nlohmann::json& options, IBuildContext& ctx);

  /// Connects `size` ranks under `group_key` (store key "<group_key>/nccl/<n>/id", n counting
  /// this backend's communicators of that group, so a group made twice never reads a stale
  /// id). Waits up to 300 s for rank 0's id and for NCCL's bootstrap (kDeadlineExceeded
  /// naming the group after that). Only DeviceType::kCuda: the CPU gives kUnimplemented (CPU
  /// tensors go over comm_gloo). Without a usable CUDA device: kUnavailable, "no CUDA device:
  /// <reason>".
  Status create_communicator(IRendezvousStore* store, StringView group_key, int32_t rank,
                             int32_t size, DeviceType device,
                             ICommunicator** out) noexcept override;

 private:
  IHost* host_;
  bool blocking_wait_;
  std::mutex mutex_;
  std::map<std::string, int> made_;  // communicators made per group key
};

}  // namespace loom::comm_nccl
