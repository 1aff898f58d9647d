#include <fmt/format.h>

#include <cstdio>

#include "core/plugin/plugin_manager.h"
#include "core/schema/schema.h"
#include "core/util/errors.h"
#include "core/version.h"
#include "loom/version.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {

core::Catalog catalog_from_args(const Args& args) {
  std::vector<fs::path> paths;
  for (const std::string& p : args.all("--plugin-path")) paths.push_back(fs::absolute(p));
  return core::Catalog(core::plugin_search_roots(paths));
}

ResolvedSpec read_spec(const Args& args) {
  ResolvedSpec out;
  out.path = args.positionals.at(0);
  out.spec = core::load_spec_file(out.path);
  for (const std::string& assignment : args.all("--set"))
    core::apply_override(out.spec, assignment);
  // Search paths: --plugin-path first, then the spec's (relative to the spec file).
  std::vector<fs::path> paths;
  for (const std::string& p : args.all("--plugin-path")) paths.push_back(fs::absolute(p));
  if (out.spec.contains("plugins") && out.spec["plugins"].is_object() &&
      out.spec["plugins"].contains("search_paths")) {
    const auto& list = out.spec["plugins"]["search_paths"];
    if (!list.is_array())
      throw core::SpecError("/plugins/search_paths",
                            fmt::format("expected array, got {}", core::compact_value(list)));
    fs::path base = fs::absolute(out.path).parent_path();
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string())
        throw core::SpecError(fmt::format("/plugins/search_paths/{}", i),
                              fmt::format("expected string, got {}", core::compact_value(list[i])));
      fs::path p = list[i].get<std::string>();
      paths.push_back(p.is_absolute() ? p : base / p);
    }
  }
  out.catalog = std::make_unique<core::Catalog>(core::plugin_search_roots(paths));
  return out;
}

ResolvedSpec load_spec(const Args& args) {
  ResolvedSpec out = read_spec(args);
  out.uses = core::resolve_spec(out.spec, *out.catalog);
  return out;
}

void load_plugins_for(ResolvedSpec& spec, core::PluginManager& manager) {
  core::load_plugins_for(spec.spec, spec.uses, manager);
}

int cmd_version(const std::vector<std::string>& argv) {
  ArgSpec spec{{"--json"}, {}, 0, 0, "loom version [--json]"};
  Args args = parse_args(argv, spec);
  nlohmann::json build = nlohmann::json::parse(core::core_build_fingerprint());
  if (args.flag("--json")) {
    nlohmann::json out = {{"loom", core::kLoomVersion},
                          {"sdk", LOOM_SDK_VERSION},
                          {"abi", {{"major", LOOM_ABI_MAJOR}, {"minor", LOOM_ABI_MINOR}}},
                          {"build", build}};
    std::printf("%s\n", out.dump(2).c_str());
    return core::kExitOk;
  }
  std::printf("loom %s\nSDK %s, plugin ABI %s\nbuilt with %s, %s\n", core::kLoomVersion,
              LOOM_SDK_VERSION, LOOM_ABI_STRING, build.value("compiler", "?").c_str(),
              build.value("cxx_stdlib", "?").c_str());
  return core::kExitOk;
}

}  // namespace loom::cli
