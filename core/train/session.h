// RunSession: one rank's part of a run, from a spec to the moment training starts, and the
// checkpoint side of starting (DESIGN.md sections 5 and 7). The `loom train` and `loom bench`
// commands are thin shells over it.
//
// open(): the spec (as read, with overrides) gets its communication backends when this
// process is one of several ranks, is resolved against the plugins' manifests (defaults
// filled in), read into a RunConfig (validated once), and its plugins are loaded; the layout
// is checked against the ranks that were started; a rank of several joins the run (the
// rendezvous store, the backends, the process grid and its role groups) and checks that
// every rank loaded the same plugins and resolved the same spec.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_writer.h"
#include "core/launch/rank_env.h"
#include "core/parallel/parallel_state.h"
#include "core/plugin/catalog.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "core/train/run_config.h"

namespace loom::core {

class Trainer;

class RunSession {
 public:
  /// Opens the session (see above). Throws SpecError, PluginError or Error naming what is
  /// wrong; nothing of the run has started then.
  /// \param spec     the spec as read (load_spec_file, apply_override); resolved here
  /// \param catalog  the plugins found on the search path
  static std::unique_ptr<RunSession> open(nlohmann::json spec, std::unique_ptr<Catalog> catalog);
  ~RunSession();
  RunSession(const RunSession&) = delete;
  RunSession& operator=(const RunSession&) = delete;

  const nlohmann::json& spec() const { return spec_; }  ///< resolved
  nlohmann::json& spec() { return spec_; }
  const RunConfig& config() const { return config_; }
  /// Replaces the data section (loom bench: synthetic tokens); the run config holds none of
  /// it, so nothing else changes.
  void set_data(const nlohmann::json& data);
  /// Sets /log/run_dir in the resolved spec.
  void set_run_dir(const std::filesystem::path& run_dir);
  PluginManager& plugins() { return *plugins_; }
  /// This rank's place in a run of several, or null for one process.
  ParallelState* parallel() { return parallel_.get(); }
  const launch::RankEnv& env() const { return env_; }
  /// Rank 0 speaks on stdout and writes the run directory's files.
  bool rank0() const { return env_.rank == 0; }
  /// The components the spec uses (what `loom train` lists).
  const std::vector<ImplUse>& uses() const { return uses_; }

  /// Where and how checkpoints are written: <run dir>/checkpoints unless /checkpoint/dir,
  /// the format, keep, async, the tokenizer's files beside them; with tensor parallelism or
  /// the distributed optimizer every rank saves its slices together (the world group).
  CheckpointWriterOptions checkpoint_writer_options(
      const std::filesystem::path& run_dir, const std::optional<std::filesystem::path>& tokenizer);
  /// Whether this rank writes checkpoints: rank 0, or every rank when they save together.
  bool saves() const { return rank0() || config_.parallel.saves_together(); }

 private:
  RunSession() = default;
  void check_layout() const;
  void join();

  nlohmann::json spec_;
  RunConfig config_;
  std::vector<ImplUse> uses_;
  launch::RankEnv env_;
  std::unique_ptr<PluginManager> plugins_;
  std::unique_ptr<ParallelState> parallel_;
};

/// Resumes `trainer` from the newest checkpoint under `root` that loads; checkpoints newer
/// than that one are damaged or do not fit the model: they are renamed *.unusable and
/// reported. Returns false when there is none. Throws when there are some but none loads.
/// Only `owner` (rank 0) renames and rewrites `latest`; every rank loads. With several
/// ranks (`world`), a checkpoint counts as loaded only when every rank loaded its part, so
/// all ranks resume from the same one.
bool resume_from_latest(Trainer& trainer, PluginManager& plugins, const std::filesystem::path& root,
                        bool owner, ICommunicator* world);

/// Drops the lines of <run_dir>/metrics.jsonl after `iteration` (a resumed run logs them
/// again).
void truncate_metrics(const std::filesystem::path& path, int64_t iteration);

}  // namespace loom::core
