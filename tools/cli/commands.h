// The subcommands of `loom`. Each returns the process exit code (core/util/errors.h) and
// throws loom::Error subclasses for user errors, which main() prints as one line.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/plugin/catalog.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "core/train/session.h"
#include "tools/cli/args.h"

namespace loom::cli {

int cmd_version(const std::vector<std::string>& argv);
int cmd_plugins(const std::vector<std::string>& argv);
int cmd_spec(const std::vector<std::string>& argv);
int cmd_train(const std::vector<std::string>& argv);
int cmd_bench(const std::vector<std::string>& argv);
int cmd_tokenizer(const std::vector<std::string>& argv);
int cmd_preprocess(const std::vector<std::string>& argv);
int cmd_dataset(const std::vector<std::string>& argv);
int cmd_checkpoint(const std::vector<std::string>& argv);
int cmd_generate(const std::vector<std::string>& argv);
int cmd_launch(const std::vector<std::string>& argv);
int cmd_schedule(const std::vector<std::string>& argv);
int cmd_plot(const std::vector<std::string>& argv);

/// Runs this binary again as `nproc` local ranks (core/launch/launcher.h: prefixed output,
/// one failure stops all, SIGINT/SIGTERM forwarded) and returns launch()'s exit code; the
/// rendezvous is a temporary directory removed at the end. For `loom train --nproc N`.
/// \param nproc                 ranks to start (>= 1)
/// \param argv_of_this_command  the ranks' arguments after the binary name, e.g.
///                              {"train", "spec.json", "--set", "x=1"}, without --nproc
///                              (each rank sees LOOM_RANK and must not relaunch)
int relaunch_self(int nproc, const std::vector<std::string>& argv_of_this_command);

/// A spec read from disk, overridden, and validated against the plugins' manifests.
struct ResolvedSpec {
  std::filesystem::path path;
  nlohmann::json spec;  ///< resolved: defaults filled in
  std::vector<core::ImplUse> uses;
  std::unique_ptr<core::Catalog> catalog;
};

/// Loads SPEC (args.positionals[0]), applies every --set and finds plugins (--plugin-path,
/// the spec's plugins.search_paths, LOOM_PLUGIN_PATH, the install); does not validate.
ResolvedSpec read_spec(const Args& args);

/// read_spec, then validates against the plugins' manifests (fills spec and uses).
ResolvedSpec load_spec(const Args& args);

/// Loads the plugins a resolved spec needs (providers of its impls and plugins.load) and
/// validates it again against what they registered.
void load_plugins_for(ResolvedSpec& spec, core::PluginManager& manager);

/// The catalog for commands without a spec: --plugin-path, LOOM_PLUGIN_PATH, install.
core::Catalog catalog_from_args(const Args& args);

/// The run session of `loom train` and `loom bench`: SPEC with its --set overrides, opened
/// (resolved, validated, plugins loaded, the run joined; core/train/session.h).
std::unique_ptr<core::RunSession> open_run_session(const Args& args);

/// --nproc N of train and bench: N, checked, and OMP_NUM_THREADS shared out when unset.
int nproc_of(const Args& args);

/// `command` and argv without --nproc: the ranks' own command line.
std::vector<std::string> without_nproc(const std::string& command,
                                       const std::vector<std::string>& argv);

}  // namespace loom::cli
