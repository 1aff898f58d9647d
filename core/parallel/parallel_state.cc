#include "core/parallel/parallel_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/launch/store.h"
#include "core/parallel/device_dispatch_communicator.h"
#include "core/parallel/local_communicator.h"
#include "core/parallel/timed_communicator.h"
#include "core/util/errors.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"

namespace loom::core {

ParallelState::ParallelState(ProcessGrid grid, std::unique_ptr<launch::Store> store,
                             ObjectPtr backend, int64_t timeout_ms, RoleOptions roles)
    : grid_(std::move(grid)),
      store_(std::move(store)),
      backend_object_(std::move(backend)),
      timeout_ms_(timeout_ms),
      roles_(roles) {
  backend_ = interface_cast<ICommBackend>(backend_object_.get());
  if (backend_ == nullptr && grid_.world_size() > 1)
    throw Error(Code::kInvalidArgument,
                "spec /parallel/comm_backend: the component is not a comm_backend");
}

void ParallelState::set_device_backend(ObjectPtr backend, DeviceType type) {
  device_backend_object_ = std::move(backend);
  device_backend_ = interface_cast<ICommBackend>(device_backend_object_.get());
  device_type_ = type;
  if (device_backend_ == nullptr && grid_.world_size() > 1)
    throw Error(Code::kInvalidArgument,
                "spec /parallel/device_comm_backend: the component is not a comm_backend");
}

ParallelState::~ParallelState() {
  std::lock_guard<std::mutex> lock(mutex_);
  comms_.clear();  // communicators before the backend that made them
}

ICommunicator& ParallelState::comm(const std::string& dims) { return comm_of(grid_.group(dims)); }

ICommunicator& ParallelState::group(ParallelRole role) {
  return comm_of(role_group(grid_, role, roles_));
}

ICommunicator& ParallelState::comm_of(const GridGroup& g) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = comms_.find(g.key);
  if (it != comms_.end()) return *static_cast<ICommunicator*>(it->second.get());
  ObjectPtr made;
  if (g.size() == 1) {
    made = ObjectPtr(new LocalCommunicator(g.key));
  } else {
    ICommunicator* inner = nullptr;
    std::string key = g.key;
    throw_if_error(backend_->create_communicator(store_.get(), StringView{key.data(), key.size()},
                                                 g.rank, g.size(), DeviceType::kCpu, &inner),
                   fmt::format("creating the communicator of group '{}' (rank {} of {})", g.key,
                               g.rank, g.size()));
    if (device_backend_ != nullptr) {
      ICommunicator* device = nullptr;
      Status status =
          device_backend_->create_communicator(store_.get(), StringView{key.data(), key.size()},
                                               g.rank, g.size(), device_type_, &device);
      if (status.code != Code::kOk) {
        inner->destroy();
        throw_if_error(status, fmt::format("creating the device communicator of group '{}' "
                                           "(rank {} of {}; spec /parallel/device_comm_backend)",
                                           g.key, g.rank, g.size()));
      }
      inner = new DeviceDispatchCommunicator(inner, device, device_type_, g.key);
    }
    inner->set_timeout_ms(timeout_ms_);
    made = ObjectPtr(new TimedCommunicator(inner, g.key, stats_));
  }
  auto* c = static_cast<ICommunicator*>(made.get());
  comms_.emplace(g.key, std::move(made));
  return *c;
}

void ParallelState::barrier_all() {
  std::vector<std::pair<std::string, ICommunicator*>> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, object] : comms_)  // std::map: sorted by the group's key
      comms.emplace_back(key, static_cast<ICommunicator*>(object.get()));
  }
  for (auto& [dims, comm] : comms)
    if (comm->size() > 1)
      throw_if_error(comm->barrier(), fmt::format("barrier of group '{}'", dims));
}

void ParallelState::check_agreement(const std::string& what, const std::string& value,
                                    std::string (*explain)(const std::string&,
                                                           const std::string&)) {
  int world = grid_.world_size();
  if (world == 1) return;
  // Ranks start at different times (loading plugins, building the model): the start-up
  // checks wait at least as long as torchrun's rendezvous would.
  auto timeout = std::chrono::milliseconds(std::max<int64_t>(timeout_ms_, 300000));
  std::string prefix = "agree/" + what + "/";
  store_->put(prefix + std::to_string(grid_.rank()), value);
  if (grid_.rank() == 0) {
    std::string verdict = "ok";
    for (int r = 1; r < world && verdict == "ok"; ++r) {
      std::string theirs = store_->wait_get(prefix + std::to_string(r), timeout);
      if (theirs != value)
        verdict =
            fmt::format("rank {} differs from rank 0 in {}: {}", r, what, explain(value, theirs));
    }
    store_->put(prefix + "verdict", verdict);
    if (verdict != "ok") throw Error(Code::kFailedPrecondition, verdict);
  } else {
    std::string verdict = store_->wait_get(prefix + "verdict", timeout);
    if (verdict != "ok") throw Error(Code::kFailedPrecondition, verdict);
  }
}

}  // namespace loom::core
