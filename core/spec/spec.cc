#include "core/spec/spec.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/plugin/catalog.h"
#include "core/plugin/plugin_manager.h"
#include "core/plugin/registry.h"
#include "core/schema/did_you_mean.h"
#include "core/schema/schema.h"
#include "core/util/errors.h"
#include "loom/cpp/json_input.h"

namespace fs = std::filesystem;

namespace loom::core {

nlohmann::json parse_spec_text(const std::string& text, const std::string& origin) {
  // parse_json_input refuses nesting deeper than kMaxJsonDepth (a value nested 100,000 deep
  // would overflow the stack of the schema walk) and numbers beyond double (1e309), and
  // names origin:line:col for every problem: "spec x.json:3:9: syntax error while ...".
  return parse_json_input(text, "spec " + origin, Code::kInvalidArgument);
}

nlohmann::json load_spec_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw IoError(fmt::format("spec file {} does not exist", path.string()));
  if (fs::is_directory(path, ec))
    throw IoError(fmt::format("spec {} is a directory; give a JSON file", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(fmt::format("cannot read spec file {}: {}", path.string(), std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json spec = parse_spec_text(text.str(), path.string());
  if (!spec.is_object())
    throw SpecError("", fmt::format("{}: the spec must be a JSON object, got {}", path.string(),
                                    compact_value(spec)));
  return spec;
}

void apply_override(nlohmann::json& spec, const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError(
        fmt::format("--set '{}': expected PATH=VALUE, e.g. --set train.steps=100", assignment));
  std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  nlohmann::json value;
  if (json_too_deep_at(text) != std::string::npos)
    throw UsageError(
        fmt::format("--set '{}': the value nests arrays or objects deeper than {} "
                    "levels; no spec field needs that",
                    assignment, kMaxJsonDepth));
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error&) {
    value = text;  // a bare word is a string: --set model.impl=gpt
  } catch (const nlohmann::json::exception& e) {
    // out_of_range.406: JSON, but a number beyond double (1e999). Taking it as a string would
    // only fail later, at the schema, with a less helpful message.
    throw UsageError(
        fmt::format("--set '{}': {}: a number too large for a double (the largest "
                    "is about 1.8e308); give a smaller one",
                    assignment, json_input_detail::problem_of(e)));
  }
  std::vector<std::string> keys;
  std::stringstream parts(path);
  for (std::string key; std::getline(parts, key, '.');) {
    if (key.empty())
      throw UsageError(fmt::format("--set '{}': empty path segment in '{}'", assignment, path));
    keys.push_back(key);
  }
  nlohmann::json* node = &spec;
  std::string pointer;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    bool last = i + 1 == keys.size();
    if (node->is_array()) {
      char* end = nullptr;
      long index = std::strtol(key.c_str(), &end, 10);
      if (*end != '\0' || index < 0 || static_cast<size_t>(index) >= node->size())
        throw SpecError(pointer, fmt::format("--set '{}': '{}' is not an index of this array of "
                                             "{} elements",
                                             assignment, key, node->size()));
      pointer += "/" + key;
      node = &(*node)[static_cast<size_t>(index)];
    } else {
      if (node->is_null()) *node = nlohmann::json::object();
      if (!node->is_object())
        throw SpecError(pointer, fmt::format("--set '{}': cannot set '{}' inside {}", assignment,
                                             key, compact_value(*node)));
      pointer = child_pointer(pointer, key);
      node = &(*node)[key];
    }
    if (last) *node = value;
  }
}

std::vector<ImplUse> resolve_spec(
    nlohmann::json& spec, const ComponentLookup& lookup,
    const std::function<std::vector<std::string>(const std::string&)>& names_of_kind,
    const std::function<std::string(const std::string&, const std::string&)>& provider_of,
    const std::string& searched) {
  std::vector<ImplUse> uses;
  SchemaHooks hooks;
  // Components nest (a layer in a model, a norm in a layer); a plugin whose option defaults
  // name a component of its own kind could nest without end, so the depth is bounded.
  constexpr int kMaxComponentDepth = 32;
  int depth = 0;
  hooks.component = [&](const std::string& kind, nlohmann::json& node, const std::string& pointer) {
    struct Nesting {
      int& depth;
      explicit Nesting(int& d) : depth(++d) {}
      ~Nesting() { --depth; }
    } nesting(depth);
    if (depth > kMaxComponentDepth)
      throw SpecError(pointer, fmt::format("components nest more than {} deep here; a "
                                           "component's defaults probably name itself (check "
                                           "the options of the plugins that provide them)",
                                           kMaxComponentDepth));
    if (!node.is_object())
      throw SpecError(pointer, fmt::format("expected a {} node {{\"impl\": NAME, ...}}, got {}",
                                           kind, compact_value(node)));
    if (!node.contains("impl"))
      throw SpecError(pointer, fmt::format("missing required key 'impl' (the {} implementation "
                                           "to use{})",
                                           kind,
                                           names_of_kind(kind).empty()
                                               ? std::string()
                                               : ": one of " + join_names(names_of_kind(kind))));
    const std::string impl_pointer = child_pointer(pointer, "impl");
    if (!node["impl"].is_string())
      throw SpecError(impl_pointer,
                      fmt::format("expected string, got {}", compact_value(node["impl"])));
    std::string name = node["impl"].get<std::string>();
    nlohmann::json schema;
    if (!lookup(kind, name, &schema)) {
      std::vector<std::string> names = names_of_kind(kind);
      std::string hint = did_you_mean(name, names);
      if (!hint.empty()) {
        // " (did you mean 'x'?)" -> " (did you mean 'x', provided by plugin p?)"
        std::string suggestion = hint.substr(hint.find('\'') + 1);
        suggestion = suggestion.substr(0, suggestion.find('\''));
        std::string plugin = provider_of(kind, suggestion);
        if (!plugin.empty())
          hint = fmt::format(" (did you mean '{}', provided by plugin {}?)", suggestion, plugin);
      }
      throw SpecError(
          impl_pointer,
          fmt::format("unknown {} impl '{}'{}; {}; plugins searched: {}", kind, name, hint,
                      names.empty() ? fmt::format("no plugin found provides any {}", kind)
                                    : "available: " + join_names(names),
                      searched));
    }
    uses.push_back({kind, name, pointer});
    // Component schemas describe their options; "impl" is the core's key, so it is set
    // aside unless the schema declares it itself.
    bool schema_has_impl = schema.is_object() && schema.contains("properties") &&
                           schema["properties"].contains("impl");
    if (schema_has_impl) {
      validate(schema, node, pointer, hooks);
      return;
    }
    nlohmann::json impl = node["impl"];
    node.erase("impl");
    validate(schema, node, pointer, hooks);
    node["impl"] = impl;
  };
  validate(core_spec_schema(), spec, "", hooks);
  return uses;
}

std::vector<ImplUse> resolve_spec(nlohmann::json& spec, const Catalog& catalog,
                                  const Registry* registry) {
  auto lookup = [&](const std::string& kind, const std::string& name, nlohmann::json* schema) {
    if (registry != nullptr)
      if (const FactoryEntry* f = registry->find_factory(kind, name)) {
        *schema = f->schema;
        return true;
      }
    if (const ManifestComponent* c = catalog.component(kind, name)) {
      *schema = c->options;
      return true;
    }
    return false;
  };
  auto names = [&](const std::string& kind) {
    std::vector<std::string> out = catalog.component_names(kind);
    if (registry != nullptr)
      for (const FactoryEntry* f : registry->factories(kind))
        if (std::find(out.begin(), out.end(), f->name) == out.end()) out.push_back(f->name);
    return out;
  };
  auto provider = [&](const std::string& kind, const std::string& name) -> std::string {
    if (const PluginRecord* p = catalog.provider(kind, name)) return p->name;
    return {};
  };
  return resolve_spec(spec, lookup, names, provider, describe_roots(catalog.roots()));
}

void write_json_atomically(const nlohmann::json& spec, const fs::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec)
    throw IoError(
        fmt::format("cannot create directory {}: {}", path.parent_path().string(), ec.message()));
  fs::path tmp = path;
  tmp += fmt::format(".tmp.{}", ::getpid());
  std::string text = spec.dump(2) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      fs::remove(tmp, ec);
      throw IoError(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    fs::remove(tmp, ec);
    throw IoError(fmt::format("cannot flush {}: {}", tmp.string(), std::strerror(err)));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw IoError(
        fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message()));
  }
}

namespace {

// The entries of /plugins/load (a resolved spec: an array of non-empty strings), each
// refused when it is a path rather than a plugin name.
std::vector<std::string> plugins_to_load(const nlohmann::json& spec) {
  std::vector<std::string> names;
  if (!spec.contains("plugins") || !spec["plugins"].contains("load")) return names;
  const nlohmann::json& list = spec["plugins"]["load"];
  for (size_t i = 0; i < list.size(); ++i) {
    std::string name = list[i].is_string() ? list[i].get<std::string>() : list[i].dump();
    // Plugin names match [a-z0-9][a-z0-9_.-]* (read_manifest): a '/' or a name of dots can
    // only be a path, which plugins.load never resolves (not against the spec's directory,
    // not against the working directory); plugins.search_paths is where directories go.
    if (name.find('/') != std::string::npos || name.find_first_not_of('.') == std::string::npos)
      throw SpecError(fmt::format("/plugins/load/{}", i),
                      fmt::format("'{}' is a path; plugins.load takes plugin names (as `loom "
                                  "plugins list` prints them). Add the plugin's parent directory "
                                  "to plugins.search_paths (a path inside the spec's directory, "
                                  "relative to it, or an absolute path) and name the plugin here",
                                  name));
    names.push_back(name);
  }
  return names;
}

}  // namespace

void check_plugins_to_load(const nlohmann::json& spec, const Catalog& catalog) {
  for (const std::string& name : plugins_to_load(spec)) {
    const PluginRecord* record = catalog.find(name);
    if (record == nullptr)
      throw PluginError(Code::kNotFound, fmt::format("plugin '{}' not found; searched: {}", name,
                                                     describe_roots(catalog.roots())));
    check_library_file_exists(*record);
  }
}

void load_plugins_for(nlohmann::json& spec, std::vector<ImplUse>& uses, PluginManager& manager) {
  std::vector<std::string> to_load = plugins_to_load(spec);
  for (const ImplUse& use : uses) {
    const PluginRecord* p = manager.catalog().provider(use.kind, use.name);
    if (p != nullptr) manager.load(p->name);
  }
  for (const std::string& name : to_load) manager.load(name);
  uses = resolve_spec(spec, manager.catalog(), &manager.registry());
}

}  // namespace loom::core
