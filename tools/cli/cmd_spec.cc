// loom spec validate SPEC [--set PATH=VALUE]... [--write-resolved FILE] [--load]
// --load also loads the plugins and kernels and builds every component (its own checks run).
#include <fmt/format.h>

#include <cstdio>

#include "core/plugin/kernel_libraries.h"
#include "core/plugin/plugin_manager.h"
#include "core/schema/did_you_mean.h"
#include "core/spec/spec.h"
#include "core/train/components.h"
#include "core/util/errors.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

int spec_validate(const Args& args) {
  ResolvedSpec spec = load_spec(args);
  std::unique_ptr<core::PluginManager> manager;
  if (args.flag("--load")) {
    core::RunConfig config = core::RunConfig::from_spec(spec.spec);
    manager = std::make_unique<core::PluginManager>(
        std::move(*spec.catalog), spec.spec["plugins"]["options"], config.train.seed);
    load_plugins_for(spec, *manager);
    // Building the components runs each plugin's own option checks (what a schema cannot
    // say: divisibility, rules across options), as `loom train` would, without training.
    core::load_kernel_libraries(*manager, config.kernels, Device{config.train.device, 0},
                                "spec /train/device");
    core::build_components(spec.spec, config, *manager);
  } else {
    // Without loading: what can be told of /plugins/load from the files alone (a plugin
    // name that the search path finds, with a library that is an ELF file).
    core::check_plugins_to_load(spec.spec, *spec.catalog);
  }
  std::string out = args.get("--write-resolved");
  if (!out.empty()) core::write_json_atomically(spec.spec, out);
  std::printf("spec %s is valid", spec.path.string().c_str());
  if (!spec.uses.empty()) {
    std::printf("; components:\n");
    const core::Catalog& catalog = manager ? manager->catalog() : *spec.catalog;
    for (const core::ImplUse& use : spec.uses) {
      const core::PluginRecord* p = catalog.provider(use.kind, use.name);
      std::printf("  %-28s %-18s %-20s plugin %s\n", use.pointer.c_str(), use.kind.c_str(),
                  use.name.c_str(), p != nullptr ? p->name.c_str() : "?");
    }
  } else {
    std::printf("\n");
  }
  if (manager) std::printf("plugins loaded and verified: %zu\n", manager->loaded().size());
  if (!out.empty()) std::printf("resolved spec written to %s\n", out.c_str());
  return core::kExitOk;
}

}  // namespace

int cmd_spec(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom spec validate SPEC [--set PATH=VALUE]... [--write-resolved FILE] [--load] "
      "[--plugin-path DIR]";
  if (argv.empty()) throw core::UsageError("missing subcommand\nusage: " + usage);
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] != "validate")
    throw core::UsageError(fmt::format("unknown subcommand 'spec {}'{}\nusage: {}", argv[0],
                                       core::did_you_mean(argv[0], {"validate"}), usage));
  return spec_validate(
      parse_args(rest, {{"--load"}, {"--set", "--write-resolved", "--plugin-path"}, 1, 1, usage}));
}

}  // namespace loom::cli
