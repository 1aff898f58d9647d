#include "core/plugin/host.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "core/parallel/grid.h"
#include "core/parallel/local_communicator.h"
#include "core/util/errors.h"
#include "core/util/log.h"
#include "core/version.h"
#include "loom/cpp/error.h"
#include "loom/cpp/op_args.h"
#include "loom/kinds.h"

namespace loom::core {
namespace {

std::string_view sv(StringView s) { return {s.data == nullptr ? "" : s.data, s.size}; }

}  // namespace

InterfaceInfo Host::interface_info() const noexcept { return kinds::kHost; }

StringView Host::core_version() const noexcept { return make_string_view(kLoomVersion); }

void Host::log(LogLevel level, StringView source, StringView message) noexcept {
  try {
    core::log(level, sv(source), sv(message));
  } catch (...) {
    // Logging must never take the process down.
  }
}

// The CPU allocator caches large blocks by their rounded size: a training step allocates
// the same activations every time, and returning them to the OS each step costs a page
// fault and a page clear per 4 KiB on the next step (measured: a fifth of a GPT-2 step).
// Small blocks go straight to malloc, which keeps its own free lists.
namespace {
constexpr uint64_t kCacheFrom = 1ull << 20;  // cache blocks of 1 MiB and more
uint64_t round_block(uint64_t bytes, uint64_t alignment) {
  uint64_t granule = bytes >= kCacheFrom ? 1ull << 16 : alignment;
  if (granule < alignment) granule = alignment;
  return (bytes + granule - 1) / granule * granule;
}
}  // namespace

Status Host::allocate(Device device, uint64_t bytes, uint64_t alignment, void** out) noexcept {
  return guard([&] {
    *out = nullptr;
    if (IDeviceRuntime* rt = runtime_or_cpu(device)) {
      throw_if_error(rt->allocate(device.index, bytes, out));
      return;
    }
    if (bytes == 0) return;
    if (alignment < 64) alignment = 64;
    if ((alignment & (alignment - 1)) != 0)
      fail(Code::kInvalidArgument, fmt::format("alignment {} is not a power of two", alignment));
    uint64_t rounded = round_block(bytes, alignment);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cpu_cache_.find(rounded);
      if (it != cpu_cache_.end() && alignment <= 4096) {
        p = it->second;
        cpu_cache_.erase(it);
        cpu_cached_bytes_ -= rounded;
      }
    }
    if (p == nullptr) {
      p = std::aligned_alloc(
          rounded >= kCacheFrom ? std::max<uint64_t>(alignment, 4096) : alignment, rounded);
      if (p == nullptr) {
        release_cache();
        p = std::aligned_alloc(alignment, rounded);
      }
    }
    if (p == nullptr)
      fail(Code::kResourceExhausted,
           fmt::format("out of host memory allocating {} bytes (in use: {} bytes)", bytes,
                       cpu_memory().current));
    std::lock_guard<std::mutex> lock(mutex_);
    cpu_blocks_[p] = rounded;
    cpu_stats_.current += rounded;
    if (cpu_stats_.current > cpu_stats_.peak) cpu_stats_.peak = cpu_stats_.current;
    *out = p;
  });
}

void Host::deallocate(Device device, void* pointer) noexcept {
  if (pointer == nullptr) return;
  if (device.type != DeviceType::kCpu) {
    if (IDeviceRuntime* rt = registry_->device_runtime(device.type))
      rt->deallocate(device.index, pointer);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cpu_blocks_.find(pointer);
  if (it == cpu_blocks_.end()) {
    core::log(LogLevel::kError, "allocator",
              "deallocate of a pointer this allocator did not give out");
    return;
  }
  uint64_t size = it->second;
  cpu_stats_.current -= size;
  cpu_blocks_.erase(it);
  if (size >= kCacheFrom) {
    cpu_cache_.emplace(size, pointer);
    cpu_cached_bytes_ += size;
  } else {
    std::free(pointer);
  }
}

void Host::release_cache() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, p] : cpu_cache_) std::free(p);
  cpu_cache_.clear();
  cpu_cached_bytes_ = 0;
}

Host::~Host() { release_cache(); }

MemoryStats Host::cpu_memory() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cpu_stats_;
}

IDeviceRuntime* Host::runtime_or_cpu(Device device) const {
  if (device.type == DeviceType::kCpu) return nullptr;
  std::string plugin;
  IDeviceRuntime* rt = registry_->device_runtime(device.type, &plugin);
  const char* name = device_type_name(device.type);
  if (rt == nullptr)
    fail(Code::kUnavailable,
         fmt::format("no {0} runtime in this process: load the {0} kernel library (spec "
                     "/plugins/load: [\"kernels_{0}\"]) or set the device to cpu",
                     name));
  int32_t count = rt->device_count();
  if (count <= 0) {
    StringView why = rt->unavailable_reason();
    fail(Code::kUnavailable,
         fmt::format("no {} device: {} (plugin '{}'); run on a machine with one, or set the "
                     "device to cpu",
                     name, sv(why).empty() ? "the runtime found none" : sv(why), plugin));
  }
  if (device.index < 0 || device.index >= count)
    fail(Code::kOutOfRange, fmt::format("{} device {} does not exist: this process sees {}", name,
                                        device.index, count));
  return rt;
}

IDeviceRuntime& Host::runtime(Device device) const {
  IDeviceRuntime* rt = runtime_or_cpu(device);
  if (rt == nullptr) fail(Code::kInternal, "Host::runtime asked for the CPU");
  return *rt;
}

DeviceMemoryStats Host::device_memory(Device device) const {
  DeviceMemoryStats stats{};
  throw_if_error(runtime(device).memory_stats(device.index, &stats));
  return stats;
}

void Host::reset_peak(Device device) {
  if (device.type == DeviceType::kCpu) return reset_peak();
  runtime(device).reset_peak(device.index);
}

Status Host::copy(Device dst_device, void* dst, Device src_device, const void* src,
                  uint64_t bytes) noexcept {
  return guard([&] {
    if (bytes == 0) return;
    if (dst == nullptr || src == nullptr)
      fail(Code::kInvalidArgument, fmt::format("copy of {} bytes with a null pointer", bytes));
    bool dst_cpu = dst_device.type == DeviceType::kCpu,
         src_cpu = src_device.type == DeviceType::kCpu;
    if (dst_cpu && src_cpu) {
      std::memmove(dst, src, bytes);
      return;
    }
    if (!dst_cpu && !src_cpu &&
        (dst_device.type != src_device.type || dst_device.index != src_device.index))
      fail(Code::kUnimplemented,
           fmt::format("copy between {} device {} and {} device {}: go through host memory",
                       device_type_name(src_device.type), src_device.index,
                       device_type_name(dst_device.type), dst_device.index));
    Device device = dst_cpu ? src_device : dst_device;
    CopyKind kind = dst_cpu   ? CopyKind::kDeviceToHost
                    : src_cpu ? CopyKind::kHostToDevice
                              : CopyKind::kDeviceToDevice;
    throw_if_error(runtime(device).copy(device.index, dst, src, bytes, kind));
  });
}

Status Host::fill_zero(Device device, void* pointer, uint64_t bytes) noexcept {
  return guard([&] {
    if (bytes == 0) return;
    if (pointer == nullptr)
      fail(Code::kInvalidArgument, fmt::format("fill_zero of {} bytes at null", bytes));
    if (IDeviceRuntime* rt = runtime_or_cpu(device)) {
      throw_if_error(rt->fill_zero(device.index, pointer, bytes));
      return;
    }
    std::memset(pointer, 0, bytes);
  });
}

void* Host::compute_stream(Device device) noexcept {
  if (device.type == DeviceType::kCpu) return nullptr;
  IDeviceRuntime* rt = registry_->device_runtime(device.type);
  return rt == nullptr ? nullptr : rt->compute_stream(device.index);
}

Status Host::synchronize(Device device) noexcept {
  return guard([&] {
    if (IDeviceRuntime* rt = runtime_or_cpu(device)) throw_if_error(rt->synchronize(device.index));
  });
}

Status Host::find_kernel(StringView op, DeviceType device, DType dtype, const OpCall* example,
                         KernelDesc* out) noexcept {
  return guard([&] {
    std::string name(sv(op));
    auto candidates = registry_->kernels(name, device, dtype);
    auto pin = pins_.find(name + "@" + dtype_name(dtype));  // a per-dtype pin wins
    if (pin == pins_.end()) pin = pins_.find(name);
    // "none": no kernel serves the op; a module with a fallback (a fused op's unfused
    // sequence) takes it, one without fails with this message.
    if (pin != pins_.end() && pin->second == "none")
      fail(Code::kNotFound,
           fmt::format("spec /kernels/pin/{}: pinned to 'none', so no kernel serves op '{}'; "
                       "pin it to a kernel (or remove the pin) for the module that needs it",
                       pin->first, name));
    const KernelEntry* chosen = nullptr;
    for (const KernelEntry* k : candidates) {
      if (pin != pins_.end()) {
        if (k->name == pin->second) chosen = k;
        continue;
      }
      if (example != nullptr && k->desc.supports != nullptr && !k->desc.supports(example)) continue;
      chosen = k;
      break;
    }
    if (chosen == nullptr && pin != pins_.end()) {
      std::string names;
      for (const KernelEntry* k : candidates) names += (names.empty() ? "" : ", ") + k->name;
      fail(Code::kNotFound,
           fmt::format("spec /kernels/pin/{}: no kernel '{}' for op '{}' with dtype {} (available: "
                       "{}); change the pin{} or load the library that provides it",
                       pin->first, pin->second, name, dtype_name(dtype),
                       names.empty() ? "none" : names,
                       pin->first == name ? fmt::format(", pin only '{}@<dtype>'", name) : ""));
    }
    if (chosen == nullptr)
      fail(Code::kNotFound,
           fmt::format("no kernel for op '{}' on device type {} with dtype {}{}: load a kernel "
                       "library that provides it",
                       name, static_cast<int>(device), dtype_name(dtype),
                       candidates.empty() ? "" : " (registered kernels reject these shapes)"));
    *out = chosen->desc;
    std::lock_guard<std::mutex> lock(mutex_);
    resolutions_.insert(Resolution{name, device, dtype, chosen->name, chosen->plugin});
  });
}

void Host::check_pins() const {
  if (pins_.empty()) return;
  const std::vector<const KernelEntry*> all = registry_->all_kernels();
  std::set<std::string> ops;
  for (const KernelEntry* k : all) ops.insert(k->op);
  for (const auto& [key, kernel] : pins_) {
    const size_t at = key.find('@');
    const std::string op = key.substr(0, at);
    DType dtype = DType::kInvalid;
    if (at != std::string::npos) {
      const std::string d = key.substr(at + 1);
      dtype = dtype_from_name(d.c_str());
      if (dtype == DType::kInvalid)
        throw SpecError(
            "/kernels/pin/" + key,
            fmt::format("'{}' is not a dtype: write \"{}@f32\" (or bf16, f16, f64, ...) "
                        "to pin the op for one dtype, \"{}\" for all",
                        d, op, op));
    }
    if (!ops.count(op)) {
      // Ops that share the name's first word, to point at the typo.
      const std::string head = op.substr(0, op.find('_'));
      std::string near;
      for (const std::string& o : ops)
        if (o.rfind(head, 0) == 0) near += (near.empty() ? "" : ", ") + o;
      throw SpecError("/kernels/pin/" + key,
                      fmt::format("no loaded kernel library has op '{}'{}; `loom plugins "
                                  "describe LIBRARY --json` lists a library's ops and kernels",
                                  op, near.empty() ? "" : " (ops with that prefix: " + near + ")"));
    }
    std::set<std::string> names;  // the op's kernels (for the dtype)
    for (const KernelEntry* k : all)
      if (k->op == op && (dtype == DType::kInvalid || k->desc.dtype == dtype))
        names.insert(k->name);
    if (kernel != "none" && !names.count(kernel)) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      throw SpecError(
          "/kernels/pin/" + key,
          fmt::format(
              "no kernel '{}' for op '{}'{} (available: {}, or \"none\")", kernel, op,
              dtype == DType::kInvalid ? "" : fmt::format(" with dtype {}", dtype_name(dtype)),
              list.empty() ? "none" : list));
    }
  }
}

std::vector<Host::Resolution> Host::resolutions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {resolutions_.begin(), resolutions_.end()};
}

void Host::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  cpu_stats_.peak = cpu_stats_.current;
}

Status Host::communicator(StringView dims, ICommunicator** out) noexcept {
  return guard([&] {
    *out = nullptr;
    std::string name(sv(dims));
    GroupSource* groups = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      groups = groups_;
    }
    // One process: every group is this process alone. The names are still checked.
    *out = groups != nullptr ? &groups->comm(name)
                             : local_comm(ProcessGrid({1, 1, 1, 1, 1}, 0).group(name));
  });
}

Status Host::group(ParallelRole role, ICommunicator** out) noexcept {
  return guard([&] {
    *out = nullptr;
    GroupSource* groups = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      groups = groups_;
    }
    *out = groups != nullptr
               ? &groups->group(role)
               : local_comm(role_group(ProcessGrid({1, 1, 1, 1, 1}, 0), role, RoleOptions{}));
  });
}

ICommunicator* Host::local_comm(const GridGroup& group) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = local_comms_.find(group.key);
  if (it == local_comms_.end())
    it = local_comms_
             .emplace(group.key,
                      std::unique_ptr<ICommunicator, void (*)(ICommunicator*)>(
                          new LocalCommunicator(group.key), [](ICommunicator* c) { c->destroy(); }))
             .first;
  return it->second.get();
}

}  // namespace loom::core
