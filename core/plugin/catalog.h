// The plugin catalog: what the search path offers, read from the sidecar manifests
// (plugin.json) alone, so plugins can be listed and specs validated without loading code.
//
// Search order (DESIGN.md section 2): the spec's plugins.search_paths (relative to the
// spec file), then LOOM_PLUGIN_PATH (colon-separated), then the install's plugin
// directory. The working directory is never searched implicitly. Each root holds one
// directory per plugin, `<root>/<name>/{plugin.json, libloom_<name>.so}`; a root may also
// be a plugin directory itself.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::core {

/// One component a manifest declares.
struct ManifestComponent {
  std::string kind;
  std::string name;
  std::string description;
  nlohmann::json options;  ///< options schema
};

/// A plugin as its sidecar manifest describes it.
struct PluginRecord {
  std::string name;
  std::string version;
  std::string description;
  std::filesystem::path dir;      ///< the plugin's directory
  std::filesystem::path library;  ///< the shared object (may not exist)
  std::filesystem::path manifest_path;
  std::string origin;       ///< which search root found it, e.g. "LOOM_PLUGIN_PATH"
  nlohmann::json manifest;  ///< parsed plugin.json
  std::vector<ManifestComponent> components;
};

/// A directory searched for plugins, with where it came from (for messages).
struct SearchRoot {
  std::filesystem::path path;
  std::string origin;  ///< "spec plugins.search_paths", "LOOM_PLUGIN_PATH", "install"
};

/// The search roots in order: `spec_paths` (already absolute), LOOM_PLUGIN_PATH, and the
/// install's plugin directories next to the running executable.
std::vector<SearchRoot> plugin_search_roots(const std::vector<std::filesystem::path>& spec_paths);

/// "a (origin), b (origin)" for messages.
std::string describe_roots(const std::vector<SearchRoot>& roots);

/// Parses and checks a manifest (schema, name, version, components and their option
/// schemas). Throws PluginError naming `path` and the bad field.
PluginRecord read_manifest(const std::filesystem::path& path, const std::string& origin);

/// Checks, without loading it, that a plugin's library exists, is a regular file and starts
/// with the ELF magic. Throws PluginError (kNotFound when missing, else kInvalidArgument)
/// naming the plugin, the file and the fix.
void check_library_file_exists(const PluginRecord& record);

class Catalog {
 public:
  /// Scans `roots`. A plugin name found twice is taken from the first root and the later
  /// one is reported at debug level; a broken manifest is an error (naming the file).
  explicit Catalog(std::vector<SearchRoot> roots);

  const std::vector<SearchRoot>& roots() const { return roots_; }
  const std::vector<PluginRecord>& plugins() const { return plugins_; }
  /// The plugin called `name`, or null.
  const PluginRecord* find(const std::string& name) const;
  /// The plugin that declares component (kind, name), or null.
  const PluginRecord* provider(const std::string& kind, const std::string& name) const;
  /// The component (kind, name), or null.
  const ManifestComponent* component(const std::string& kind, const std::string& name) const;
  /// Names of all components of `kind`, sorted.
  std::vector<std::string> component_names(const std::string& kind) const;

 private:
  std::vector<SearchRoot> roots_;
  std::vector<PluginRecord> plugins_;
};

}  // namespace loom::core
