#include "core/plugin/catalog.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/schema/schema.h"
#include "core/util/errors.h"
#include "core/util/log.h"
#include "loom/cpp/json_input.h"
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
  const std::string where = path.string();
  const std::string fix = "fix the plugin's manifest";
  // Every problem of the file is a PluginError (exit code 4) naming it; parse_json_input and
  // JsonIn throw loom::Error naming the line and column or the JSON pointer, never one of
  // nlohmann's exceptions (a manifest nested 100,000 deep, 1e309, "description": 3).
  try {
    record.manifest = parse_json_input(read_text(path), where, Code::kInvalidArgument, fix);
    JsonIn m(record.manifest, where, Code::kInvalidArgument, fix);
    m.expect_object();
    std::string schema = m["schema"].string();
    if (schema != "loom.plugin/1")
      m["schema"].fail(
          fmt::format("'{}' is not 'loom.plugin/1', the manifest schema this loom "
                      "reads",
                      schema));
    record.name = m["name"].string();
    static const std::regex kName("[a-z0-9][a-z0-9_.-]*");
    if (!std::regex_match(record.name, kName))
      m["name"].fail(fmt::format("'{}' must match [a-z0-9][a-z0-9_.-]*", record.name));
    record.version = m["version"].string();
    record.description = m.has("description") ? m["description"].string() : std::string();
    std::string library = "libloom_" + record.name + ".so";
    if (m.has("library")) {
      library = m["library"].string();
      // The library sits beside its manifest: a path ("../x.so", "/lib/x.so") would make
      // the manifest of one directory load code from another.
      fs::path file(library);
      if (library.empty() || file.has_parent_path() || file.is_absolute() || library == "." ||
          library == "..")
        m["library"].fail(
            fmt::format("'{}' is not a file name; the library must sit beside "
                        "plugin.json, in {}",
                        library, record.dir.string()));
    }
    record.library = record.dir / library;
    if (m.has("components")) {
      for (const JsonIn& c : m["components"].elements()) {
        ManifestComponent component;
        component.kind = c["kind"].string();
        component.name = c["name"].string();
        component.description = c.has("description") ? c["description"].string() : std::string();
        if (!is_component_kind(component.kind))
          c["kind"].fail(fmt::format("'{}' is not a component kind of this loom", component.kind));
        component.options = c.has("options") ? c["options"].json() : nlohmann::json::object();
        check_schema(component.options, fmt::format("{} {}/options", where, c.pointer()));
        record.components.push_back(std::move(component));
      }
    }
  } catch (const PluginError&) {
    throw;
  } catch (const IoError&) {
    throw;
  } catch (const Error& e) {
    throw PluginError(Code::kInvalidArgument, e.what());
  }
  return record;
}

void check_library_file_exists(const PluginRecord& record) {
  const std::string lib = record.library.string();
  std::error_code ec;
  if (!fs::exists(record.library, ec))
    throw PluginError(Code::kNotFound,
                      fmt::format("plugin '{}': library {} is missing (its manifest is {}); build "
                                  "or reinstall the plugin",
                                  record.name, lib, record.manifest_path.string()));
  bool elf = false;
  if (fs::is_regular_file(record.library, ec)) {
    char magic[4] = {};
    std::ifstream in(record.library, std::ios::binary);
    constexpr char kElfMagic[4] = {0x7f, 'E', 'L', 'F'};
    elf = in.read(magic, 4) && std::memcmp(magic, kElfMagic, 4) == 0;
  }
  if (!elf)
    throw PluginError(Code::kInvalidArgument,
                      fmt::format("plugin '{}': {} is not a shared object (no ELF header); "
                                  "rebuild the plugin",
                                  record.name, lib));
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
