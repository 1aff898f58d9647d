// CheckpointWriter: saves checkpoints under a root directory (layout in checkpoint.h),
// atomically, keeping the last K, optionally in the background.
//
// An asynchronous save copies every tensor into a host snapshot first (the caller may
// change its memory as soon as save() returns), then a worker thread writes the snapshot
// while training goes on. At most one save is in flight: the next save(), wait() or the
// destructor waits for it; an error of a background save is thrown by the next of these.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "loom/kinds/checkpoint_format.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

/// One tensor to save, or this rank's slice of it.
struct SaveTensor {
  std::string name;                  ///< "model.<param>", "optim.<state>.<param>", ...
  DType dtype;                       ///< element type of `data`
  std::vector<int64_t> shape;        ///< global shape
  const void* data;                  ///< host memory, contiguous: the slice
  std::vector<int64_t> offset = {};  ///< where the slice starts (empty: the whole tensor)
  std::vector<int64_t> local = {};   ///< the slice's shape (empty: the whole tensor)
  /// The shape of what `data` holds.
  const std::vector<int64_t>& slice_shape() const { return local.empty() ? shape : local; }
};

/// Options of a CheckpointWriter (the spec's /checkpoint section).
struct CheckpointWriterOptions {
  std::filesystem::path root;                     ///< checkpoint root directory (created)
  nlohmann::json format = {{"impl", "sharded"}};  ///< the checkpoint_format node
  int64_t keep = 3;    ///< complete checkpoints kept; older ones are deleted (0: keep all)
  bool async = false;  ///< write in the background from a snapshot
  /// Files copied into every checkpoint: {relative destination, source}, e.g.
  /// {"tokenizer/vocab.json", "/data/gpt2-vocab.json"}.
  std::vector<std::pair<std::string, std::filesystem::path>> extra_files;
  /// Several ranks saving one checkpoint together (each its slices, through a format that
  /// keeps them, e.g. sharded), or null for one process. Every rank calls save() with the
  /// same iteration; rank 0 writes the metadata, renames the directory into place and
  /// updates `latest` once every rank's part is durable. Saves are then synchronous (the
  /// communicator belongs to the training thread).
  ICommunicator* world = nullptr;
};

class CheckpointWriter {
 public:
  /// Builds the format (loading its plugin) and removes saves that a killed process left
  /// half-written (iter_*.tmp-*) under the root.
  CheckpointWriter(PluginManager& plugins, CheckpointWriterOptions options);
  /// Waits for a save in flight (errors are logged, not thrown, here).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Saves `tensors` and `metadata` (kinds/checkpoint_format.h; "tensors" is filled here)
  /// as iteration `iteration`. Synchronous: returns when the checkpoint is durable and
  /// `latest` names it. Asynchronous: returns after the snapshot. Throws IoError naming
  /// the path on failure; the previous checkpoints are untouched then.
  void save(int64_t iteration, const std::vector<SaveTensor>& tensors, nlohmann::json metadata);
  /// Waits for the save in flight and rethrows its error.
  void wait();
  /// The directory of the last save that completed, if any.
  std::optional<std::filesystem::path> last_saved() const;
  const std::filesystem::path& root() const { return options_.root; }

 private:
  struct Job {
    int64_t iteration = 0;
    std::vector<SaveTensor> tensors;
    std::vector<std::vector<char>> owned;  // the snapshot (async)
    nlohmann::json metadata;
  };
  void write(const Job& job);  // the whole save: temporary dir, format, rename, latest, keep
  void prune();

  PluginManager& plugins_;
  CheckpointWriterOptions options_;
  ObjectPtr object_;
  ICheckpointFormat* format_ = nullptr;
  std::thread worker_;
  mutable std::mutex mutex_;
  std::exception_ptr error_;
  std::optional<std::filesystem::path> last_saved_;
};

/// Writes one checkpoint directory `final_dir` atomically: into "<final_dir>.tmp-PID"
/// through `format`, plus `extra_files` ({relative destination, source}), then renamed into
/// place (replacing a directory of that name) with the parent directory fsync'ed.
/// `metadata` must already list the tensors. `iteration` is for the fault hook only.
/// With `world` (several ranks), every rank calls it: the ranks agree on the temporary
/// directory, each writes its part, and rank 0 finishes once all succeeded; a failure on
/// any rank fails the save on every rank.
void write_checkpoint_directory(
    ICheckpointFormat& format, const std::filesystem::path& final_dir,
    const std::vector<SaveTensor>& tensors, const nlohmann::json& metadata,
    const std::vector<std::pair<std::string, std::filesystem::path>>& extra_files,
    int64_t iteration, ICommunicator* world = nullptr);

/// Test hook: when the environment variable LOOM_CHECKPOINT_FAULT is "POINT:ITERATION"
/// and a save of ITERATION reaches POINT ("part": this rank's part written, before the
/// ranks agree that all parts are; "written": files complete, before the rename;
/// "renamed": before `latest` is updated), the process kills itself with SIGKILL;
/// "POINT:ITERATION:RANK" kills only the rank whose LOOM_RANK is RANK (0 without it).
void checkpoint_fault_point(const char* point, int64_t iteration);

}  // namespace loom::core
