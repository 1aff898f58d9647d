// Host: the core's implementation of loom::IHost, the services plugins reach.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/parallel/roles.h"
#include "core/plugin/registry.h"
#include "loom/host.h"

namespace loom::core {

/// Memory figures of one device, in bytes.
struct MemoryStats {
  uint64_t current = 0;
  uint64_t peak = 0;
};

class Host final : public IHost {
 public:
  /// \param registry  where kernels are looked up; must outlive the host
  /// \param seed      the run's base seed
  Host(const Registry* registry, uint64_t seed) : registry_(registry), seed_(seed) {}
  virtual ~Host();

  InterfaceInfo interface_info() const noexcept override;
  StringView core_version() const noexcept override;
  void log(LogLevel level, StringView source, StringView message) noexcept override;
  Status allocate(Device device, uint64_t bytes, uint64_t alignment, void** out) noexcept override;
  void deallocate(Device device, void* pointer) noexcept override;
  Status find_kernel(StringView op, DeviceType device, DType dtype, const OpCall* example,
                     KernelDesc* out) noexcept override;
  Status communicator(StringView dims, ICommunicator** out) noexcept override;
  Status group(ParallelRole role, ICommunicator** out) noexcept override;
  uint64_t seed() const noexcept override { return seed_; }
  Status copy(Device dst_device, void* dst, Device src_device, const void* src,
              uint64_t bytes) noexcept override;
  Status fill_zero(Device device, void* pointer, uint64_t bytes) noexcept override;
  void* compute_stream(Device device) noexcept override;
  Status synchronize(Device device) noexcept override;

  /// The runtime of `device`'s family; throws kUnavailable naming the fix when no kernel
  /// library registered one or it found no such device.
  IDeviceRuntime& runtime(Device device) const;
  /// Memory figures of a device other than the CPU (throws like runtime()).
  DeviceMemoryStats device_memory(Device device) const;
  /// Resets the peak of `device` (the CPU allocator's or a runtime's).
  void reset_peak(Device device);
  /// Throws, naming the fix, unless `device` can hold tensors in this process.
  void check_device(Device device) const { (void)runtime_or_cpu(device); }

  /// Memory use of the CPU allocator.
  MemoryStats cpu_memory() const;
  /// Returns the cached free blocks of the CPU allocator to the system.
  void release_cache() noexcept;
  /// Bytes held in the CPU allocator's cache (freed by their users, kept for reuse).
  uint64_t cpu_cached_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cpu_cached_bytes_;
  }
  /// Resets the peak of the CPU allocator to its current use (for per-phase figures).
  void reset_peak();

  /// Pins ops to kernels by name (spec /kernels/pin: {"gemm": "cpu.ref"}): find_kernel
  /// then returns that kernel or fails naming the pin. A key "op@dtype" ("gemm@f32") pins the
  /// op for that dtype only, and wins over a plain "op" pin there.
  void set_pins(std::map<std::string, std::string> pins) { pins_ = std::move(pins); }

  /// Checks every pin against the kernels registered so far (call it once every plugin the
  /// run needs is loaded, e.g. after the model is built): the op must have a kernel in some
  /// loaded library, an "@dtype" suffix must name a dtype, and the kernel must be "none" or
  /// one registered for that op (and dtype). A pin the run never consulted would otherwise
  /// pass silently. Throws SpecError naming /kernels/pin/<key> and what is available.
  void check_pins() const;

  /// Serves IHost::communicator and IHost::group from `groups` (a multi-process run's
  /// ParallelState; it must outlive its use here, null to stop). Without one, every group
  /// is this process alone (a size-1 communicator).
  void set_groups(GroupSource* groups) {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_ = groups;
  }

  /// One kernel resolution made through find_kernel.
  struct Resolution {
    std::string op;
    DeviceType device;
    DType dtype;
    std::string kernel;  ///< KernelDesc::name
    std::string plugin;  ///< the library that registered it
    bool operator<(const Resolution& o) const {
      return std::tie(op, device, dtype, kernel) < std::tie(o.op, o.device, o.dtype, o.kernel);
    }
  };
  /// Every distinct resolution so far, sorted (what `loom train` prints).
  std::vector<Resolution> resolutions() const;

 private:
  IDeviceRuntime* runtime_or_cpu(Device device) const;  // null for the CPU

  const Registry* registry_;
  uint64_t seed_;
  mutable std::mutex mutex_;
  std::map<void*, uint64_t> cpu_blocks_;  // live allocations: pointer -> bytes
  MemoryStats cpu_stats_;
  std::multimap<uint64_t, void*> cpu_cache_;  // freed large blocks by rounded size
  uint64_t cpu_cached_bytes_ = 0;
  std::map<std::string, std::string> pins_;
  std::set<Resolution> resolutions_;
  GroupSource* groups_ = nullptr;
  // Single process: one size-1 communicator per group name.
  ICommunicator* local_comm(const GridGroup& group);
  std::map<std::string, std::unique_ptr<ICommunicator, void (*)(ICommunicator*)>> local_comms_;
};

}  // namespace loom::core
