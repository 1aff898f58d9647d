// ParallelState: this rank's membership in a multi-process run: the process grid, the
// rendezvous store, the communication backend (a plugin, spec /parallel/comm_backend) and
// the communicators of the grid's groups, created on first use. The trainer and the
// host (IHost::communicator, for modules) reach groups through it; nothing is global.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/parallel/comm_stats.h"
#include "core/parallel/grid.h"
#include "core/parallel/roles.h"
#include "loom/cpp/object.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

namespace launch {
class Store;
}  // namespace launch

class ParallelState final : public GroupSource {
 public:
  /// \param grid        this rank's place on the grid
  /// \param store       the run's rendezvous store (keys already prefixed by the run id)
  /// \param backend     the comm_backend component (ICommBackend); owned
  /// \param timeout_ms  the timeout of every operation and of the rendezvous
  /// \param roles       how roles map onto the grid (roles.h)
  ParallelState(ProcessGrid grid, std::unique_ptr<launch::Store> store, ObjectPtr backend,
                int64_t timeout_ms, RoleOptions roles = {});
  /// Serves the tensors of `type` (not the CPU) through `backend` (a second comm_backend,
  /// spec /parallel/device_comm_backend): each group's communicator then sends host
  /// tensors over the first backend and `type` tensors over this one. Call before comm().
  void set_device_backend(ObjectPtr backend, DeviceType type);
  ~ParallelState() override;
  ParallelState(const ParallelState&) = delete;
  ParallelState& operator=(const ParallelState&) = delete;

  const ProcessGrid& grid() const { return grid_; }
  /// The communicator of this rank's group over `dims` ("tp", "dp", "tp,dp", "world").
  /// Created on first use, which is collective over the group's members: every rank asks
  /// for its groups in the same order (modules are built in the same order on every rank).
  /// Size-1 groups need no backend.
  ICommunicator& comm(const std::string& dims) override;
  /// The communicator of this rank's group for `role` (roles.h), created on first use like
  /// comm(). Two roles over the same dimensions share one communicator.
  ICommunicator& group(ParallelRole role) override;
  /// A barrier on every communicator made so far (groups of more than one rank), in the
  /// order of their dimension lists, the same on every rank (so no two ranks wait on each
  /// other's groups in a cycle). It also brings out a failure a device backend has recorded
  /// without reporting it yet: NCCL's collectives complete on the GPU after the calls that
  /// issued them have returned, and their failure reaches the caller only at its next call
  /// (call it before writing state that a failed collective may have left half reduced).
  /// Throws the first failure, naming the group.
  void barrier_all();
  /// Communication time and bytes of this rank.
  CommStats& stats() { return stats_; }
  int64_t timeout_ms() const { return timeout_ms_; }

  /// Checks that every rank holds the same `value` for `what` (the plugins it loaded, the
  /// resolved spec). Rank 0 compares every rank's value with its own and publishes the
  /// verdict; when some rank differs, every rank throws the same message, which names the
  /// rank and says what differs (`explain(rank0_value, other_value)`).
  void check_agreement(const std::string& what, const std::string& value,
                       std::string (*explain)(const std::string& mine, const std::string& theirs));

 private:
  ProcessGrid grid_;
  std::unique_ptr<launch::Store> store_;
  ObjectPtr backend_object_;
  ObjectPtr device_backend_object_;
  ICommBackend* device_backend_ = nullptr;
  DeviceType device_type_ = DeviceType::kCpu;
  ICommBackend* backend_ = nullptr;
  int64_t timeout_ms_;
  CommStats stats_;
  std::mutex mutex_;
  RoleOptions roles_;
  std::map<std::string, ObjectPtr> comms_;  // by the group's key (canonical dims and index)
  // The communicator of `g`, made on first use.
  ICommunicator& comm_of(const GridGroup& g);
};

}  // namespace loom::core
