// Export to and import from a Hugging Face model directory (model.safetensors, config.json,
// generation_config.json): the work of the "safetensors" checkpoint format.
#pragma once

#include <loom/sdk.h>

#include <filesystem>
#include <string>

namespace loom::checkpoint {

/// Writes the "model.*" tensors as a GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM
/// or Qwen2MoeForCausalLM directory (the architecture follows the metadata's spec.model,
/// hf_model.h). Only rank 0 writes; it must hold every weight whole. `dtype` is the exported
/// dtype, or kInvalid to keep each tensor's own. The metadata, with "tensors" reduced to the model weights, is kept in the
/// safetensors header as "__metadata__" {"format": "pt", "loom": JSON text}.
void export_hf(const std::filesystem::path& dir, const CheckpointTensor* tensors, int64_t count,
               const std::string& metadata_json, int32_t rank, DType dtype);

/// Fills `requests` (loom names, any slice, f32/bf16/f16) from a Hugging Face directory,
/// mapping names and layouts back. See ICheckpointFormat::load for the error codes.
void import_hf(const std::filesystem::path& dir, CheckpointTensor* requests, int64_t count);

/// The loom metadata of a Hugging Face directory: what loom's export stored, else one
/// synthesised from config.json and the safetensors headers ("spec": {"model": ...}).
std::string hf_metadata(const std::filesystem::path& dir);

}  // namespace loom::checkpoint
