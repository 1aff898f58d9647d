// The spec: one JSON document that describes a run (DESIGN.md section 3).
//
// Loading goes: read and parse the file (syntax errors name line and column), apply
// `--set a.b.c=VALUE` overrides, then validate the whole document once, up front: the
// core's own sections against the core schema, and every `{"impl": NAME, ...}` node
// against the options schema of the component that NAME selects. Defaults are filled in;
// the result is the resolved spec that a run writes into its run directory.
#pragma once

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::core {

class Catalog;
class Registry;

/// Reads and parses a spec file. Throws IoError when unreadable, loom::Error
/// (kInvalidArgument) "spec FILE:LINE:COL: syntax error ..." when it is not JSON (or nests
/// deeper than loom::kMaxJsonDepth, or holds a number beyond double).
nlohmann::json load_spec_file(const std::filesystem::path& path);

/// Parses JSON text with the same line:column messages; `origin` names it ("spec x.json").
nlohmann::json parse_spec_text(const std::string& text, const std::string& origin);

/// Applies one override "a.b.c=VALUE" (VALUE is JSON when it parses as JSON, else a
/// string; a path segment that is a number indexes an array). Missing objects on the path
/// are created. Throws UsageError for a malformed override (also a VALUE that is JSON but
/// holds a number beyond double, 1e999, or nests deeper than loom::kMaxJsonDepth) and
/// SpecError when the path runs into a value that is not an object or array.
void apply_override(nlohmann::json& spec, const std::string& assignment);

/// The schema of the core's spec sections (top level: model, parallel, precision,
/// optimizer, lr_schedule, data, train, checkpoint, plugins, kernels, log).
const nlohmann::json& core_spec_schema();

/// One `{"impl": NAME}` node of a spec: its kind, NAME and JSON pointer.
struct ImplUse {
  std::string kind;
  std::string name;
  std::string pointer;
};

/// Looks up a component's options schema: returns false when (kind, name) is unknown.
using ComponentLookup =
    std::function<bool(const std::string& kind, const std::string& name, nlohmann::json* schema)>;

/// Validates `spec` against the core schema and every component node against its
/// component's schema (found through `lookup`), filling defaults in place. Returns every
/// component node, in document order.
/// \param spec           the spec, modified in place
/// \param lookup         finds component schemas
/// \param names_of_kind  all component names of a kind (for did-you-mean)
/// \param provider_of    which plugin provides (kind, name), "" if none (for messages)
/// \param searched       the plugin search path, for the "not found" message
std::vector<ImplUse> resolve_spec(
    nlohmann::json& spec, const ComponentLookup& lookup,
    const std::function<std::vector<std::string>(const std::string&)>& names_of_kind,
    const std::function<std::string(const std::string&, const std::string&)>& provider_of,
    const std::string& searched);

/// resolve_spec with components from a catalog (manifests) and, where loaded, the registry.
std::vector<ImplUse> resolve_spec(nlohmann::json& spec, const Catalog& catalog,
                                  const Registry* registry = nullptr);

/// Checks /plugins/load of a resolved spec without loading anything (`loom spec validate`
/// without --load): every entry is a plugin name, not a path (SpecError at
/// /plugins/load/N), that `catalog` finds (PluginError kNotFound, "plugin 'x' not found;
/// searched: ..."), whose library exists, is a regular file and starts with the ELF magic
/// (PluginError, as loading would say).
void check_plugins_to_load(const nlohmann::json& spec, const Catalog& catalog);

class PluginManager;

/// Loads the plugins a resolved spec uses (the providers of its impls and /plugins/load),
/// then validates it again against what they registered (the registry is the authority:
/// a plugin's factories may differ from its manifest). Updates `uses`.
void load_plugins_for(nlohmann::json& spec, std::vector<ImplUse>& uses, PluginManager& manager);

/// Writes `spec` as indented JSON to `path` atomically (temporary file, fsync, rename).
void write_json_atomically(const nlohmann::json& spec, const std::filesystem::path& path);

}  // namespace loom::core
