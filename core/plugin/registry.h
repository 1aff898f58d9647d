// The registry: every factory and kernel that the loaded plugins provide.
//
// One per process (owned by the PluginManager). Plugins reach it only through the
// IRegistry view handed to their register_components, which records who registered what.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/registry.h"

namespace loom::core {

/// A registered factory and where it came from.
struct FactoryEntry {
  std::string kind;
  int32_t major = 0;
  int32_t minor = 0;
  std::string name;
  std::string description;
  nlohmann::json schema;  ///< options schema, checked when registered
  IFactory* factory = nullptr;
  std::string plugin;  ///< name of the plugin that registered it
};

/// A registered kernel; the descriptor's strings point into this entry.
struct KernelEntry {
  std::string op;
  std::string name;
  std::string plugin;
  KernelDesc desc{};
};

class Registry {
 public:
  /// An IRegistry that records `plugin` as the owner of what is added through it. The
  /// view must not outlive the registry.
  std::unique_ptr<IRegistry, void (*)(IRegistry*)> view_for(const std::string& plugin);

  /// The factory (kind, name) or null.
  const FactoryEntry* find_factory(const std::string& kind, const std::string& name) const;
  /// All factories of `kind` (every kind when empty), sorted by (kind, name).
  std::vector<const FactoryEntry*> factories(const std::string& kind = {}) const;
  /// Kernels for (op, device, dtype), highest priority first.
  std::vector<const KernelEntry*> kernels(const std::string& op, DeviceType device,
                                          DType dtype) const;
  /// Every kernel, sorted by (op, device, dtype, priority desc).
  std::vector<const KernelEntry*> all_kernels() const;

  /// Adds a factory for `plugin` (throws loom::Error with the code IRegistry reports).
  void add_factory(const std::string& plugin, const FactoryDesc& desc, IFactory* factory);
  /// Adds a kernel for `plugin` (throws loom::Error).
  void add_kernel(const std::string& plugin, const KernelDesc& desc);
  /// Adds the runtime of a device family for `plugin` (throws loom::Error: kAlreadyExists
  /// when the family has one, kInvalidArgument for the CPU or a null runtime).
  void add_device_runtime(const std::string& plugin, IDeviceRuntime* runtime);
  /// The runtime of `type` or null; `plugin` (when not null) receives who registered it.
  IDeviceRuntime* device_runtime(DeviceType type, std::string* plugin = nullptr) const;

 private:
  std::map<std::pair<std::string, std::string>, std::unique_ptr<FactoryEntry>> factories_;
  std::vector<std::unique_ptr<KernelEntry>> kernels_;
  std::map<DeviceType, std::pair<IDeviceRuntime*, std::string>> runtimes_;  // -> (runtime, plugin)
};

}  // namespace loom::core
