#include "core/plugin/catalog.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/schema/schema.h"
#include "core/util/errors.h"
#include "core/util/log.h"
#include "loom/kinds.h"

namespace fs = std::filesystem;

namespace loom::core {
namespace {

bool is_component_kind(const std::string& kind) {
  for (const InterfaceInfo& info : kinds::kComponentKinds)
    if (kind == info.kind) return true;
  return false;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read {}", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<SearchRoot> plugin_search_roots(const std::vector<fs::path>& spec_paths) {
  std::vector<SearchRoot> roots;
  for (const fs::path& p : spec_paths) roots.push_back({p, "spec plugins.search_paths"});
  if (const char* env = std::getenv("LOOM_PLUGIN_PATH")) {
    std::stringstream list(env);
    std::string item;
    while (std::getline(list, item, ':'))
      if (!item.empty()) roots.push_back({fs::absolute(item), "LOOM_PLUGIN_PATH"});
  }
  // The install's plugin directory, found from the executable (never from the cwd):
  // PREFIX/bin/loom -> PREFIX/lib/loom/plugins; in the build tree bazel-bin/tools/loom ->
  // bazel-bin/plugins and bazel-bin/kernels (kernel libraries are plugins too).
  std::error_code ec;
  fs::path exe_dir = boost::dll::program_location(ec).parent_path();
  if (!ec) {
    for (fs::path candidate : {exe_dir / ".." / "lib" / "loom" / "plugins",
                               exe_dir / ".." / "plugins", exe_dir / ".." / "kernels"}) {
      if (fs::is_directory(candidate, ec))
        roots.push_back({fs::canonical(candidate, ec), "install"});
    }
  }
  return roots;
}

std::string describe_roots(const std::vector<SearchRoot>& roots) {
  if (roots.empty()) return "(no search paths: set LOOM_PLUGIN_PATH or plugins.search_paths)";
  std::string out;
  for (const SearchRoot& r : roots) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({})", r.path.string(), r.origin);
  }
  return out;
}

PluginRecord read_manifest(const fs::path& path, const std::string& origin) {
  PluginRecord record;
  record.manifest_path = path;
  record.dir = path.parent_path();
  record.origin = origin;
  std::string where = path.string();
  try {
    record.manifest = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw PluginError(
        Code::kInvalidArgument,
        fmt::format("{}: not valid JSON ({}); fix the plugin's manifest", where, e.what()));
  }
  const nlohmann::json& m = record.manifest;
  auto need_string = [&](const nlohmann::json& obj, const char* key, const std::string& at) {
    if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string())
      throw PluginError(Code::kInvalidArgument,
                        fmt::format("{}: {}/{} must be a string", where, at, key));
    return obj[key].get<std::string>();
  };
  if (!m.is_object()) throw PluginError(Code::kInvalidArgument, where + ": must be a JSON object");
  std::string schema = need_string(m, "schema", "");
  if (schema != "loom.plugin/1")
    throw PluginError(
        Code::kInvalidArgument,
        fmt::format("{}: /schema is '{}', this loom reads 'loom.plugin/1'", where, schema));
  record.name = need_string(m, "name", "");
  static const std::regex kName("[a-z0-9][a-z0-9_.-]*");
  if (!std::regex_match(record.name, kName))
    throw PluginError(
        Code::kInvalidArgument,
        fmt::format("{}: /name '{}' must match [a-z0-9][a-z0-9_.-]*", where, record.name));
  record.version = need_string(m, "version", "");
  record.description = m.value("description", "");
  std::string library =
      m.contains("library") ? need_string(m, "library", "") : "libloom_" + record.name + ".so";
  record.library = record.dir / library;
  if (m.contains("components") && !m["components"].is_array())
    throw PluginError(Code::kInvalidArgument, where + ": /components must be an array");
  int index = 0;
  for (const auto& c : m.value("components", nlohmann::json::array())) {
    std::string at = fmt::format("/components/{}", index++);
    ManifestComponent component;
    component.kind = need_string(c, "kind", at);
    component.name = need_string(c, "name", at);
    component.description = c.value("description", "");
    if (!is_component_kind(component.kind))
      throw PluginError(Code::kInvalidArgument,
                        fmt::format("{}: {}/kind '{}' is not a component kind of this loom", where,
                                    at, component.kind));
    component.options = c.value("options", nlohmann::json::object());
    try {
      check_schema(component.options, fmt::format("{} {}/options", where, at));
    } catch (const Error& e) {
      throw PluginError(Code::kInvalidArgument, e.what());
    }
    record.components.push_back(std::move(component));
  }
  return record;
}

Catalog::Catalog(std::vector<SearchRoot> roots) : roots_(std::move(roots)) {
  auto consider = [&](const fs::path& manifest, const std::string& origin) {
    PluginRecord record = read_manifest(manifest, origin);
    if (const PluginRecord* first = find(record.name)) {
      log_debug("plugins", fmt::format("plugin '{}' in {} is shadowed by {} (earlier in the "
                                       "search order)",
                                       record.name, record.dir.string(), first->dir.string()));
      return;
    }
    plugins_.push_back(std::move(record));
  };
  for (const SearchRoot& root : roots_) {
    std::error_code ec;
    if (!fs::is_directory(root.path, ec)) {
      log_warning("plugins", fmt::format("plugin search path {} ({}) is not a directory",
                                         root.path.string(), root.origin));
      continue;
    }
    if (fs::exists(root.path / "plugin.json", ec)) {
      consider(root.path / "plugin.json", root.origin);
      continue;
    }
    std::vector<fs::path> dirs;
    for (const auto& entry : fs::directory_iterator(root.path, ec))
      if (entry.is_directory(ec) && fs::exists(entry.path() / "plugin.json", ec))
        dirs.push_back(entry.path());
    std::sort(dirs.begin(), dirs.end());  // deterministic order
    for (const fs::path& dir : dirs) consider(dir / "plugin.json", root.origin);
  }
}

const PluginRecord* Catalog::find(const std::string& name) const {
  for (const PluginRecord& p : plugins_)
    if (p.name == name) return &p;
  return nullptr;
}

const PluginRecord* Catalog::provider(const std::string& kind, const std::string& name) const {
  for (const PluginRecord& p : plugins_)
    for (const ManifestComponent& c : p.components)
      if (c.kind == kind && c.name == name) return &p;
  return nullptr;
}

const ManifestComponent* Catalog::component(const std::string& kind,
                                            const std::string& name) const {
  for (const PluginRecord& p : plugins_)
    for (const ManifestComponent& c : p.components)
      if (c.kind == kind && c.name == name) return &c;
  return nullptr;
}

std::vector<std::string> Catalog::component_names(const std::string& kind) const {
  std::vector<std::string> names;
  for (const PluginRecord& p : plugins_)
    for (const ManifestComponent& c : p.components)
      if (c.kind == kind) names.push_back(c.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace loom::core
