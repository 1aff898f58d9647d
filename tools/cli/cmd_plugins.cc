// loom plugins list | describe NAME | check [NAME]
#include <fmt/format.h>

#include <cstdio>

#include "core/plugin/plugin_manager.h"
#include "core/schema/did_you_mean.h"
#include "core/util/errors.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

// One line per option of a schema: name, type, default, description.
void print_options(const nlohmann::json& schema, const std::string& indent) {
  if (!schema.is_object() || !schema.contains("properties")) {
    std::printf("%s(no options)\n", indent.c_str());
    return;
  }
  std::vector<std::string> required = schema.value("required", std::vector<std::string>{});
  for (const auto& [name, prop] : schema["properties"].items()) {
    std::string type;
    if (prop.contains("x-loom-component"))
      type = "component " + prop["x-loom-component"].get<std::string>();
    else if (prop.contains("enum"))
      type = "one of " + prop["enum"].dump();
    else if (prop.contains("type"))
      type = prop["type"].is_string() ? prop["type"].get<std::string>() : prop["type"].dump();
    std::string range;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"})
      if (prop.contains(k)) range += fmt::format(" {}={}", k, prop[k].dump());
    std::string def = prop.contains("default") ? " default " + prop["default"].dump()
                      : std::find(required.begin(), required.end(), name) != required.end()
                          ? " required"
                          : "";
    std::printf("%s%-22s %s%s%s\n", indent.c_str(), name.c_str(), type.c_str(), range.c_str(),
                def.c_str());
    if (prop.contains("description"))
      std::printf("%s%-22s   %s\n", indent.c_str(), "",
                  prop["description"].get<std::string>().c_str());
  }
}

int plugins_list(const Args& args) {
  core::Catalog catalog = catalog_from_args(args);
  if (args.flag("--json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const core::PluginRecord& p : catalog.plugins())
      out.push_back({{"name", p.name},
                     {"version", p.version},
                     {"dir", p.dir.string()},
                     {"origin", p.origin},
                     {"manifest", p.manifest}});
    std::printf("%s\n", out.dump(2).c_str());
    return core::kExitOk;
  }
  std::printf("plugin search path: %s\n", core::describe_roots(catalog.roots()).c_str());
  if (catalog.plugins().empty()) {
    std::printf("no plugins found\n");
    return core::kExitOk;
  }
  for (const core::PluginRecord& p : catalog.plugins()) {
    std::printf("\n%s %s  (%s)\n", p.name.c_str(), p.version.c_str(), p.dir.string().c_str());
    if (!p.description.empty()) std::printf("  %s\n", p.description.c_str());
    for (const core::ManifestComponent& c : p.components)
      std::printf("  %-18s %-24s %s\n", c.kind.c_str(), c.name.c_str(), c.description.c_str());
    if (p.manifest.contains("kernels"))
      for (const auto& k : p.manifest["kernels"])
        std::printf("  %-18s %-24s %s\n", "kernel", k.value("op", "?").c_str(),
                    k.value("name", "").c_str());
  }
  return core::kExitOk;
}

int plugins_describe(const Args& args) {
  core::Catalog catalog = catalog_from_args(args);
  const std::string name = args.positionals.at(0);
  bool json = args.flag("--json");
  if (const core::PluginRecord* p = catalog.find(name)) {
    if (json) {
      std::printf("%s\n", p->manifest.dump(2).c_str());
      return core::kExitOk;
    }
    std::printf("%s %s  (%s)\n", p->name.c_str(), p->version.c_str(), p->dir.string().c_str());
    if (!p->description.empty()) std::printf("%s\n", p->description.c_str());
    for (const core::ManifestComponent& c : p->components) {
      std::printf("\n%s '%s': %s\n", c.kind.c_str(), c.name.c_str(), c.description.c_str());
      print_options(c.options, "  ");
    }
    return core::kExitOk;
  }
  // A component name: describe every kind that has it.
  bool found = false;
  for (const core::PluginRecord& p : catalog.plugins())
    for (const core::ManifestComponent& c : p.components) {
      if (c.name != name) continue;
      found = true;
      if (json) {
        std::printf("%s\n", nlohmann::json({{"plugin", p.name},
                                            {"kind", c.kind},
                                            {"name", c.name},
                                            {"description", c.description},
                                            {"options", c.options}})
                                .dump(2)
                                .c_str());
        continue;
      }
      std::printf("%s '%s' (plugin %s %s): %s\n", c.kind.c_str(), c.name.c_str(), p.name.c_str(),
                  p.version.c_str(), c.description.c_str());
      print_options(c.options, "  ");
    }
  if (found) return core::kExitOk;
  std::vector<std::string> names;
  for (const core::PluginRecord& p : catalog.plugins()) {
    names.push_back(p.name);
    for (const core::ManifestComponent& c : p.components) names.push_back(c.name);
  }
  throw core::PluginError(
      Code::kNotFound,
      fmt::format("no plugin or component named '{}'{}; searched: {}", name,
                  core::did_you_mean(name, names), core::describe_roots(catalog.roots())));
}

int plugins_check(const Args& args) {
  core::PluginManager manager(catalog_from_args(args));
  std::vector<std::string> names;
  if (!args.positionals.empty())
    names.push_back(args.positionals[0]);
  else
    for (const core::PluginRecord& p : manager.catalog().plugins()) names.push_back(p.name);
  if (names.empty()) {
    std::printf("no plugins found; searched: %s\n",
                core::describe_roots(manager.catalog().roots()).c_str());
    return core::kExitOk;
  }
  for (const std::string& name : names) {
    manager.load(name);  // throws the first failure with its message
    const core::LoadedPlugin& p = manager.loaded().back();
    std::printf("%-20s %-8s ok  ABI %u.%u  %s\n", name.c_str(), p.info->version, p.info->abi_major,
                p.info->abi_minor, p.build.value("compiler", "?").c_str());
  }
  return core::kExitOk;
}

}  // namespace

int cmd_plugins(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom plugins list|describe NAME|check [NAME] [--json] [--plugin-path DIR]";
  if (argv.empty()) throw core::UsageError("missing subcommand\nusage: " + usage);
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  const std::string& sub = argv[0];
  if (sub == "list")
    return plugins_list(parse_args(
        rest,
        {{"--json"}, {"--plugin-path"}, 0, 0, "loom plugins list [--json] [--plugin-path DIR]"}));
  if (sub == "describe")
    return plugins_describe(
        parse_args(rest, {{"--json"},
                          {"--plugin-path"},
                          1,
                          1,
                          "loom plugins describe NAME [--json] [--plugin-path DIR]"}));
  if (sub == "check")
    return plugins_check(parse_args(
        rest, {{}, {"--plugin-path"}, 0, 1, "loom plugins check [NAME] [--plugin-path DIR]"}));
  throw core::UsageError(fmt::format("unknown subcommand 'plugins {}'{}\nusage: {}", sub,
                                     core::did_you_mean(sub, {"list", "describe", "check"}),
                                     usage));
}

}  // namespace loom::cli
