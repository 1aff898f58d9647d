// PluginManager: loads plugins from the catalog and owns the registry and the host.
//
// Loading a plugin (DESIGN.md section 2): check the file is a shared object that exports
// `loom_plugin_v1` without running any of its code; open it with RTLD_NOW | RTLD_LOCAL;
// call the entry point and check the ABI major (equal) and minor (core >= plugin) before
// anything else; check name, version and embedded manifest against the sidecar; log the
// build fingerprint; call init and register_components; check that what was registered
// is exactly what the manifest declares. Libraries are never unloaded.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/plugin/catalog.h"
#include "core/plugin/host.h"
#include "core/plugin/registry.h"
#include "loom/plugin.h"

namespace loom::core {

/// A plugin that is loaded and registered.
struct LoadedPlugin {
  const PluginRecord* record = nullptr;
  const PluginInfo* info = nullptr;
  void* state = nullptr;
  nlohmann::json build;  ///< parsed build fingerprint
};

class PluginManager {
 public:
  /// \param catalog         what can be loaded
  /// \param plugin_options  the spec's plugins.options object: name -> options for init
  /// \param seed            the run's base seed, handed to plugins through the host
  PluginManager(Catalog catalog, nlohmann::json plugin_options = nlohmann::json::object(),
                uint64_t seed = 0);
  /// Shuts every loaded plugin down (reverse load order).
  ~PluginManager();
  PluginManager(const PluginManager&) = delete;
  PluginManager& operator=(const PluginManager&) = delete;

  /// Loads the plugin `name` (no-op when loaded). Throws PluginError.
  void load(const std::string& name);
  /// Loads every plugin in the catalog; stops at the first failure.
  void load_all();
  /// Calls every loaded plugin's shutdown once, newest first.
  void shutdown();

  const Catalog& catalog() const { return catalog_; }
  const Registry& registry() const { return registry_; }
  Host& host() { return host_; }
  const std::vector<LoadedPlugin>& loaded() const { return loaded_; }
  bool is_loaded(const std::string& name) const;

 private:
  Catalog catalog_;
  nlohmann::json plugin_options_;
  Registry registry_;
  Host host_;
  std::vector<LoadedPlugin> loaded_;
};

/// The build fingerprint of the core, as JSON text.
const char* core_build_fingerprint();

}  // namespace loom::core
