// The mixture-of-experts families of the Hugging Face mapping (MixtralForCausalLM,
// Qwen2MoeForCausalLM, Qwen3MoeForCausalLM; hf_model.h): their part of the spec reading (export), of
// config.json (both ways) and of the loom model node (import), for hf_model.cc and
// hf_config.cc.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "plugins/checkpoint/hf_model.h"
#include "plugins/checkpoint/json_fields.h"

namespace loom::checkpoint {

/// kUnimplemented "spec /model<pointer> = <value>: <why>; the safetensors export writes ...".
[[noreturn]] void refuse_spec(const std::string& pointer, const nlohmann::json& value,
                              const std::string& why);

/// Refuses (refuse_spec) the non-null keys of the spec node `node` at `pointer` outside
/// `known`: settings the export would otherwise drop without a word.
void known_spec_keys(const nlohmann::json& node, const std::string& pointer,
                     std::set<std::string> known);

/// Which layers of the "gpt" node `m` take layer.mlp (true) rather than layer.dense_mlp:
/// its moe_layer_freq (an integer N: i % N == 0; or a list of 0/1), for `layers` layers.
std::vector<bool> moe_layer_pattern(const nlohmann::json& m, int64_t layers);

/// Export: the moe node (layer.mlp, impl "moe") of the rope "gpt" node `m` whose layers
/// `sparse` marks, into h.moe, and the family (h.family) that expresses it, from h.qkv_bias
/// and h.qk_norm too (qk_layernorm: Qwen3-MoE); refuses what no family expresses.
void moe_from_spec(const nlohmann::json& m, const std::vector<bool>& sparse, HfModel& h);

/// The family's keys added to (or replacing those of) the rope families' shared `config`.
void moe_config(const HfModel& h, nlohmann::json& config);

/// Import: h.moe, h.qkv_bias and h.qk_norm from the Mixtral, Qwen2-MoE or Qwen3-MoE
/// config.json `c` (h.family and the shared keys, head_dim included, already read).
void moe_from_config(const ConfigReader& c, HfModel& h);

/// The mixture of experts of `h` in the loom model node `node` (LLaMA's so far).
void moe_node(const HfModel& h, nlohmann::json& node);

}  // namespace loom::checkpoint
