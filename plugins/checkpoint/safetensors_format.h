// checkpoint_format "safetensors": Hugging Face export and import of model weights, as
// GPT2LMHeadModel or LlamaForCausalLM directories (hf_model.h, hf_layout.h, hf_io.h).
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>

namespace loom::checkpoint {

/// Options (manifest "safetensors"): dtype ("auto" | "f32" | "bf16" | "f16"), the dtype of
/// exported weights; auto keeps each tensor's own.
class SafetensorsFormat final : public Object<ICheckpointFormat> {
 public:
  SafetensorsFormat(const nlohmann::json& options, IBuildContext& ctx);

  /// Rank 0 writes model.safetensors, config.json (and generation_config.json when the
  /// token ids are known) from the "model.*" tensors; other tensors are not kept.
  Status save(StringView dir, const CheckpointTensor* tensors, int64_t count,
              StringView metadata_json, int32_t rank, int32_t world) noexcept override;
  /// Reads loom-named weights from a directory loom or transformers wrote; "optim.*" is
  /// kNotFound (model weights only).
  Status load(StringView dir, CheckpointTensor* tensors, int64_t count) noexcept override;
  /// loom's stored metadata, else one synthesised from config.json.
  Status metadata(StringView dir, StringView* metadata_json) noexcept override;
  /// config.json plus model.safetensors or model.safetensors.index.json exist.
  bool recognizes(StringView dir) noexcept override;

 private:
  DType dtype_ = DType::kInvalid;  // kInvalid: auto
  std::string metadata_text_;      // what metadata() returned last
};

}  // namespace loom::checkpoint
