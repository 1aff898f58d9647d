// The Hugging Face architectures loom exports to and imports from, and the translation
// between a loom "gpt" model node and a transformers config.json:
//
//   GPT2LMHeadModel   layernorm, learned positions, gelu_tanh ("gelu_new") or gelu, biases
//                     everywhere, multi-head attention, tied or untied embeddings
//   LlamaForCausalLM  rmsnorm, rotary (rotate-half layout, base, linear or llama3 scaling),
//                     swiglu, no biases, grouped-query attention, tied or untied
//
// Anything else is refused with kUnimplemented naming the spec field (export) or the
// config.json key (import) that rules it out.
#pragma once

#include <loom/sdk.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace loom::checkpoint {

enum class HfFamily { kGpt2, kLlama };

/// One model in both vocabularies (C hidden, H heads, G query groups, D head dim, F ffn).
struct HfModel {
  HfFamily family = HfFamily::kGpt2;
  int64_t layers = 0, hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t positions = 0;     ///< learned table rows (GPT-2) or max_position_embeddings
  bool tied = true;          ///< output layer shares the word embeddings
  double eps = 1e-5;         ///< of every norm
  std::string activation;    ///< loom's name: gelu_tanh, gelu or swiglu
  double rope_base = 10000;  ///< LLaMA
  nlohmann::json rope_scaling = nlohmann::json::object();  ///< loom's rotary.scaling node
  double init_std = 0.02;
  std::optional<int64_t> bos, eos;  ///< token ids, when known
};

/// "GPT2LMHeadModel" or "LlamaForCausalLM".
const char* hf_architecture(HfFamily family);

/// The model of a loom checkpoint's metadata (kinds/checkpoint_format.h): its spec's
/// "model" node, spec.train.seq_length for a null max_position_embeddings, and the eod id
/// (spec.data.eod_id, or metadata.trainer.tokenizer.eod / trainer.eod_id) as bos and eos.
/// Refuses a model GPT-2 or LLaMA cannot express with kUnimplemented naming the field.
HfModel hf_model_from_metadata(const nlohmann::json& metadata);

/// config.json for transformers (4.40 reads it); `dtype` gives "torch_dtype".
nlohmann::json hf_config(const HfModel& model, DType dtype);

/// The model described by a transformers config.json read from `file` (defaults as
/// transformers fills them). Unsupported settings are kUnimplemented, malformed values
/// kInvalidArgument, both naming the file and the key.
HfModel hf_model_from_config(const nlohmann::json& config, const std::filesystem::path& file);

/// The loom spec "model" node ("impl": "gpt") equivalent to `model`.
nlohmann::json loom_model_node(const HfModel& model);

}  // namespace loom::checkpoint
