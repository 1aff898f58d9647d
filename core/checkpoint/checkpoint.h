// Checkpoints on disk (DESIGN.md section 7): the directory layout, reading any checkpoint
// through its format plugin, and writing them atomically, asynchronously, keeping the last
// K.
//
// Layout of a checkpoint root (checkpoint.dir):
//   latest                 text: the name of the newest complete iteration directory
//   iter_0000100/          one checkpoint, written by a format plugin (sharded: metadata.json
//                          and shards/; safetensors: model.safetensors and config.json)
//     tokenizer/           the run's tokenizer files, when it had one (for generation)
//   iter_0000200/
//   iter_0000300.tmp-PID/  a save in progress (or killed): never read, removed on resume
//   latest.tmp.PID.N       a replacement of `latest` in progress (or killed): removed by the
//                          next save or resume
// An iteration's metadata records the size and CRC-32C of its plain files (the tokenizer
// copy) under "files" (checkpoint_files.h); they are checked before generation uses them.
// A save writes iter_N.tmp-PID, has every file fsync'ed, renames it to iter_N, fsyncs the
// root, then replaces `latest` atomically. Killing the process at any moment leaves every
// complete checkpoint intact and `latest` naming one of them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_files.h"
#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "core/runtime/parameters.h"
#include "loom/kinds/checkpoint_format.h"

namespace loom::core {

/// "iter_0000100" for 100 (Megatron's naming, seven digits).
std::string iteration_dir_name(int64_t iteration);

/// The directory `root/latest` names, when it names an existing iteration directory.
std::optional<std::filesystem::path> read_latest(const std::filesystem::path& root);

/// Why `root/latest` does not name a complete checkpoint, for messages ("latest names
/// iter_0000040, which is missing"), or "" when it does.
std::string latest_problem(const std::filesystem::path& root);

/// Removes the temporaries ("latest.tmp.PID.N") that a process killed while replacing
/// `latest` left under `root`: every one not of this process. Call it on the one process
/// that writes `latest` (rank 0), before it saves or resumes.
void remove_stale_latest(const std::filesystem::path& root);

/// The complete iteration directories under `root`, newest first (by iteration number).
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& root);

/// Builds the checkpoint_format component of spec node `node` ({"impl": NAME, options...}),
/// loading the plugin that provides it and filling option defaults from its manifest.
/// \param pointer  where the node sits in the spec, for messages ("/checkpoint/format")
ObjectPtr make_checkpoint_format(PluginManager& plugins, nlohmann::json node,
                                 const std::string& pointer);

/// The format component that recognises `dir` ("sharded", "safetensors", ...): asks every
/// checkpoint_format the catalog lists, loading its plugin. Throws IoError naming the
/// directory and the formats tried when none does.
std::string detect_format(PluginManager& plugins, const std::filesystem::path& dir);

/// The files of the tokenizer at `path` (a directory holding tokenizer.json or vocab.json +
/// merges.txt and their configs, a tokenizer.json, or a vocab.json with its merges.txt), as
/// {prefix + name in a checkpoint, source}: what a checkpoint copies to stay self-contained.
std::vector<std::pair<std::string, std::filesystem::path>> tokenizer_files(
    const std::filesystem::path& path, const std::string& prefix);

/// A checkpoint opened for reading.
class CheckpointReader {
 public:
  /// Opens `path`: a checkpoint root (follows `latest`, or the newest iteration directory
  /// when `latest` is missing), one iteration directory, or a directory another program
  /// wrote in a format loom reads (a Hugging Face model directory). Reads and verifies the
  /// metadata. `format` names the format component; empty: detect_format.
  CheckpointReader(PluginManager& plugins, const std::filesystem::path& path,
                   const std::string& format = "");
  ~CheckpointReader();

  const std::filesystem::path& dir() const { return dir_; }
  const std::string& format() const { return format_; }
  /// The metadata (kinds/checkpoint_format.h): format_version, iteration, spec, tensors, ...
  const nlohmann::json& metadata() const { return metadata_; }
  int64_t iteration() const;
  /// The "model" node of the spec that saved it.
  const nlohmann::json& model_spec() const;
  /// True when the checkpoint holds a tensor called `name`.
  bool has(const std::string& name) const;

  /// Reads the whole tensor `name` into host memory `out` (its dtype; f32/bf16/f16 are
  /// converted). Throws naming the checkpoint directory and the tensor on a missing tensor,
  /// a shape mismatch or damage.
  void read(const std::string& name, const TensorView& out);
  /// Reads several tensors in one call (faster for formats that open files once).
  void read(std::vector<CheckpointTensor>& requests);
  /// Loads every parameter of `params` from "model.<name>", checking shapes first: a
  /// parameter the checkpoint lacks or holds with another shape is an error naming both.
  void load_model(ParameterSet& params, const SplitRanks& ranks = {});

  /// The directory of tokenizer files saved with the checkpoint, if there is one (a
  /// Hugging Face directory with tokenizer.json or vocab.json + merges.txt counts). When the
  /// metadata records the files' checksums, each is checked first: a missing or damaged
  /// copy is Error(kDataLoss) naming the file and the fix.
  std::optional<std::filesystem::path> tokenizer() const;

  /// Whether the metadata records checksums of the plain files (the tokenizer copy).
  bool files_recorded() const { return metadata_.contains("files"); }
  /// The state of every recorded file (empty when none is recorded).
  std::vector<FileCheck> check_files() const;

 private:
  PluginManager& plugins_;
  std::filesystem::path dir_;
  std::string format_;
  ObjectPtr object_;
  ICheckpointFormat* impl_ = nullptr;
  nlohmann::json metadata_;
};

}  // namespace loom::core
