// Test environment of the checkpoint plugin: the real plugin loaded through the core from
// the test's runfiles, formats built the way the core builds them, and tensors that own
// their bytes.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"

namespace loom::testing {

/// A checkpoint_format component built from {"impl": NAME, options...}.
struct Format {
  ObjectPtr object;
  ICheckpointFormat* api = nullptr;
  ICheckpointFormat* operator->() const { return api; }
};

class CheckpointEnv {
 public:
  /// Loads plugins/checkpoint from the runfiles.
  CheckpointEnv();
  /// Builds the format `node` ({"impl": "sharded"}) as the spec's /checkpoint/format.
  Format format(const nlohmann::json& node);

 private:
  std::unique_ptr<core::PluginManager> plugins_;
};

/// A tensor (or slice) that owns its bytes, convertible to a CheckpointTensor.
struct OwnedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape, offset, shape;
  std::vector<unsigned char> bytes;

  /// A view of the bytes as a CheckpointTensor (valid while this object lives).
  CheckpointTensor view();
  /// The elements as float (f32, bf16 or f16).
  std::vector<float> floats() const;
};

/// A whole tensor of `shape` with random bytes (f32/bf16/f16: random normal values).
OwnedTensor random_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          std::mt19937& rng);
/// A zero-filled request for the slice [offset, offset + shape) of a `global_shape` tensor.
OwnedTensor request(const std::string& name, DType dtype, std::vector<int64_t> global_shape,
                    std::vector<int64_t> offset, std::vector<int64_t> shape);
/// The slice [offset, offset + shape) of the whole tensor `whole` (same dtype).
OwnedTensor slice_of(const OwnedTensor& whole, std::vector<int64_t> offset,
                     std::vector<int64_t> shape);

/// A status as (code, message); releases it.
struct Outcome {
  Code code = Code::kOk;
  std::string message;
};
Outcome outcome(Status status);

/// save(dir, tensors) on one format.
Outcome save(Format& format, const std::filesystem::path& dir, std::vector<OwnedTensor>& tensors,
             const nlohmann::json& metadata, int32_t rank = 0, int32_t world = 1);
/// load(dir, requests).
Outcome load(Format& format, const std::filesystem::path& dir, std::vector<OwnedTensor>& requests);
/// metadata(dir), parsed into `out` on success.
Outcome metadata(Format& format, const std::filesystem::path& dir, nlohmann::json* out);

/// A fresh, empty directory under the test's temporary directory.
std::filesystem::path fresh_dir(const std::string& name);

/// Minimal checkpoint metadata (kinds/checkpoint_format.h) listing `tensors`.
nlohmann::json metadata_for(const std::vector<OwnedTensor>& tensors,
                            const nlohmann::json& spec = nlohmann::json::object());

}  // namespace loom::testing
