#include "core/plugin/plugin_manager.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <boost/dll/library_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstddef>

#include "core/util/errors.h"
#include "core/util/log.h"
#include "loom/cpp/fingerprint.h"

namespace fs = std::filesystem;
namespace dll = boost::dll;

namespace loom::core {
namespace {

// Libraries are never unloaded (DESIGN.md section 2): their handles live in a vector that
// is deliberately never destroyed, so no static destructor can dlclose them.
std::vector<dll::shared_library>& open_libraries() {
  static auto* libraries = new std::vector<dll::shared_library>();
  return *libraries;
}

// The smallest PluginInfo this core understands: ABI 1.0 ends with `shutdown`.
constexpr size_t kMinPluginInfoSize = offsetof(PluginInfo, shutdown) + sizeof(void*);

// Checks the file and its exports without running any code of it.
void check_library_file(const PluginRecord& record) {
  check_library_file_exists(record);  // present, a regular file, an ELF header
  const std::string lib = record.library.string();
  std::vector<std::string> symbols;
  try {
    dll::library_info info(record.library, /*throw_if_not_native=*/true);
    symbols = info.symbols();
  } catch (const std::exception& e) {
    throw PluginError(Code::kInvalidArgument,
                      fmt::format("plugin '{}': {} is not a readable shared object ({}); rebuild "
                                  "the plugin",
                                  record.name, lib, e.what()));
  }
  bool has_entry = false;
  std::vector<std::string> other_entries;
  for (const std::string& s : symbols) {
    if (s == LOOM_PLUGIN_ENTRY_V1)
      has_entry = true;
    else if (s.rfind("loom_plugin_v", 0) == 0)
      other_entries.push_back(s);
  }
  if (!has_entry) {
    std::string found =
        other_entries.empty() ? "no loom entry point" : "found " + other_entries.front();
    throw PluginError(Code::kAbiMismatch,
                      fmt::format("plugin '{}': {} does not export '{}' ({}); a loom plugin "
                                  "defines it with LOOM_PLUGIN(...) from <loom/sdk.h>",
                                  record.name, lib, LOOM_PLUGIN_ENTRY_V1, found));
  }
}

std::string last_dlerror_for(const fs::path& path) {
  // Boost.DLL reports a generic error code; dlopen again to get the loader's own words.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return "unknown reason";  // cannot happen; never dlclose'd anyway
  const char* why = dlerror();
  return why != nullptr ? why : "unknown reason";
}

}  // namespace

const char* core_build_fingerprint() { return LOOM_BUILD_FINGERPRINT_JSON; }

PluginManager::PluginManager(Catalog catalog, nlohmann::json plugin_options, uint64_t seed)
    : catalog_(std::move(catalog)),
      plugin_options_(std::move(plugin_options)),
      host_(&registry_, seed) {}

PluginManager::~PluginManager() { shutdown(); }

bool PluginManager::is_loaded(const std::string& name) const {
  for (const LoadedPlugin& p : loaded_)
    if (p.record->name == name) return true;
  return false;
}

void PluginManager::load_all() {
  for (const PluginRecord& record : catalog_.plugins()) load(record.name);
}

void PluginManager::load(const std::string& name) {
  if (is_loaded(name)) return;
  const PluginRecord* record = catalog_.find(name);
  if (record == nullptr)
    throw PluginError(Code::kNotFound, fmt::format("plugin '{}' not found; searched: {}", name,
                                                   describe_roots(catalog_.roots())));
  const std::string lib = record->library.string();
  check_library_file(*record);

  dll::shared_library library;
  std::error_code ec;
  library.load(record->library, dll::load_mode::rtld_now | dll::load_mode::rtld_local, ec);
  if (ec || !library.is_loaded())
    throw PluginError(Code::kInvalidArgument, fmt::format("plugin '{}': cannot load {}: {}", name,
                                                          lib, last_dlerror_for(record->library)));
  open_libraries().push_back(library);  // never unloaded
  if (!library.has(LOOM_PLUGIN_ENTRY_V1))
    throw PluginError(Code::kAbiMismatch,
                      fmt::format("plugin '{}': {} has '{}' in its symbol table but does not "
                                  "export it; build it with the SDK's loom_plugin rule or "
                                  "loom_add_plugin (they set the visibility)",
                                  name, lib, LOOM_PLUGIN_ENTRY_V1));
  auto& entry = library.get<const PluginInfo*()>(LOOM_PLUGIN_ENTRY_V1);
  const PluginInfo* info = entry();

  // ABI first: nothing else of the struct is read before these checks pass.
  if (info == nullptr)
    throw PluginError(Code::kAbiMismatch,
                      fmt::format("plugin '{}': {} returned no plugin info", name, lib));
  if (info->abi_major != LOOM_ABI_MAJOR)
    throw PluginError(
        Code::kAbiMismatch,
        fmt::format("{} was built for SDK ABI {}.{}, this loom provides {}: "
                    "rebuild it against SDK {}.x",
                    lib, info->abi_major, info->abi_minor, LOOM_ABI_STRING, LOOM_ABI_MAJOR));
  if (info->abi_minor > LOOM_ABI_MINOR)
    throw PluginError(
        Code::kAbiMismatch,
        fmt::format("{} was built for SDK ABI {}.{}, newer than this loom's {}: "
                    "upgrade loom or rebuild the plugin against SDK {}",
                    lib, info->abi_major, info->abi_minor, LOOM_ABI_STRING, LOOM_ABI_STRING));
  if (info->struct_size < kMinPluginInfoSize)
    throw PluginError(Code::kAbiMismatch,
                      fmt::format("{}: plugin info is {} bytes, ABI {}.0 needs {}; rebuild it", lib,
                                  info->struct_size, LOOM_ABI_MAJOR, kMinPluginInfoSize));
  if (info->init == nullptr || info->register_components == nullptr || info->name == nullptr ||
      info->version == nullptr || info->manifest_json == nullptr)
    throw PluginError(Code::kAbiMismatch,
                      fmt::format("{}: plugin info lacks name, version, manifest, init or "
                                  "register_components",
                                  lib));

  // The library must be the one its sidecar describes.
  if (record->name != info->name || record->version != info->version)
    throw PluginError(Code::kInvalidArgument,
                      fmt::format("{} says it is plugin '{}' {} but its manifest {} says '{}' "
                                  "{}: reinstall the plugin so both come from one build",
                                  lib, info->name, info->version, record->manifest_path.string(),
                                  record->name, record->version));
  nlohmann::json embedded;
  try {
    embedded = nlohmann::json::parse(info->manifest_json);
  } catch (const nlohmann::json::exception& e) {
    throw PluginError(Code::kInvalidArgument,
                      fmt::format("{}: embedded manifest is not valid JSON: {}", lib, e.what()));
  }
  if (embedded != record->manifest)
    throw PluginError(Code::kInvalidArgument,
                      fmt::format("{}: embedded manifest differs from {}; reinstall the plugin "
                                  "so both come from one build",
                                  lib, record->manifest_path.string()));

  LoadedPlugin loaded;
  loaded.record = record;
  loaded.info = info;
  try {
    loaded.build = nlohmann::json::parse(info->build_json != nullptr ? info->build_json : "{}");
  } catch (const nlohmann::json::exception&) {
    loaded.build = nlohmann::json::object();
  }
  nlohmann::json core_build = nlohmann::json::parse(core_build_fingerprint());
  log_debug("plugins",
            fmt::format("loading '{}' {} from {} (ABI {}.{}, build {})", name, info->version, lib,
                        info->abi_major, info->abi_minor, loaded.build.dump()));
  for (const char* key : {"cxx11_abi", "glibcxx_debug"})
    if (loaded.build.contains(key) && loaded.build[key] != core_build[key])
      log_warning("plugins",
                  fmt::format("plugin '{}' was built with {}={}, loom with {}; harmless across "
                              "the SDK boundary, but keep the plugin's own C++ types inside it",
                              name, key, loaded.build[key].dump(), core_build[key].dump()));

  // init, then register.
  std::string options = plugin_options_.contains(name) ? plugin_options_[name].dump() : "{}";
  Status status = info->init(&host_, StringView{options.data(), options.size()}, &loaded.state);
  if (status.code != Code::kOk) {
    std::string why = take_message(&status);
    throw PluginError(
        status.code == Code::kAbiMismatch ? Code::kAbiMismatch : Code::kFailedPrecondition,
        fmt::format("plugin '{}' ({}): init failed: {}", name, lib, why));
  }
  loaded_.push_back(loaded);  // from here on, shutdown is owed
  auto view = registry_.view_for(name);
  status = info->register_components(loaded.state, view.get());
  if (status.code != Code::kOk) {
    std::string why = take_message(&status);
    throw PluginError(status.code,
                      fmt::format("plugin '{}' ({}): registration failed: {}", name, lib, why));
  }

  // What was registered must be what the manifest declares, both ways.
  for (const ManifestComponent& c : record->components) {
    const FactoryEntry* f = registry_.find_factory(c.kind, c.name);
    if (f == nullptr || f->plugin != name)
      throw PluginError(Code::kInvalidArgument,
                        fmt::format("plugin '{}': its manifest declares {} '{}' but the plugin "
                                    "did not register it",
                                    name, c.kind, c.name));
    if (f->schema != c.options)
      throw PluginError(Code::kInvalidArgument,
                        fmt::format("plugin '{}': {} '{}' is registered with an options schema "
                                    "that differs from its manifest",
                                    name, c.kind, c.name));
  }
  for (const FactoryEntry* f : registry_.factories())
    if (f->plugin == name && std::none_of(record->components.begin(), record->components.end(),
                                          [&](const ManifestComponent& c) {
                                            return c.kind == f->kind && c.name == f->name;
                                          }))
      throw PluginError(Code::kInvalidArgument,
                        fmt::format("plugin '{}' registers {} '{}', which its manifest does not "
                                    "declare: add it to the manifest's components",
                                    name, f->kind, f->name));
}

void PluginManager::shutdown() {
  while (!loaded_.empty()) {
    LoadedPlugin p = loaded_.back();
    loaded_.pop_back();
    if (p.info->shutdown != nullptr) p.info->shutdown(p.state);
  }
}

}  // namespace loom::core
