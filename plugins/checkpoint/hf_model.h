// The Hugging Face architectures loom exports to and imports from, and the translation
// between a loom "gpt" model node and a transformers config.json:
//
//   GPT2LMHeadModel   layernorm, learned positions, gelu_tanh ("gelu_new") or gelu, biases
//                     everywhere, multi-head attention, tied or untied embeddings
//   LlamaForCausalLM  rmsnorm, rotary (rotate-half layout, base, linear or llama3 scaling),
//                     swiglu, no biases, grouped-query attention, tied or untied
//   Qwen2ForCausalLM  (Qwen2 / Qwen2.5) LLaMA's with biases on q/k/v_proj (none on o_proj
//                     or the MLP), plain rope (rope_theta; no scaling), no sliding window
//   Qwen3ForCausalLM  LLaMA's with an explicit head_dim and q_norm / k_norm (loom's
//                     qk_layernorm), no biases (attention_bias false), plain rope
//   MixtralForCausalLM   LLaMA's attention and norms, every layer a mixture of experts:
//                     softmax router, top-K renormalised (loom's pre_softmax false), swiglu
//                     experts, no shared expert
//   Qwen2MoeForCausalLM  LLaMA's with q/k/v biases, mixture-of-experts layers (top-K of the
//                     softmax over all experts, renormalised or not: norm_topk_prob), a
//                     shared expert gated by sigmoid(x . w), dense layers where
//                     decoder_sparse_step / mlp_only_layers say so
//   Qwen3MoeForCausalLM  LLaMA's attention with an explicit head_dim and q_norm / k_norm
//                     (RMSNorm per head over head_dim before rope: loom's qk_layernorm), no
//                     q/k/v biases, Qwen2-MoE's routing without a shared expert
//
// Export picks the family from the spec: a dense MLP -> GPT-2 for learned positions, else
// (rope) Qwen3 with qk_layernorm (q/k/v biases refused: Qwen3's attention_bias would put
// one on o_proj too, which loom lacks), else Qwen2 with add_qkv_bias (what an HF user
// expects of a LLaMA with q/k/v biases only), else LLaMA; a mixture of experts -> Mixtral when it
// has no shared experts, pre_softmax false, no q/k/v bias and every layer MoE, else Qwen2-MoE (what
// Mixtral lacks it writes as exact zeros: q/k/v biases of 0 and a shared expert of width 0 when
// loom has none); a mixture of experts with qk_layernorm -> Qwen3-MoE (no shared expert, no q/k/v
// bias).
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
#include <vector>

namespace loom::checkpoint {

enum class HfFamily { kGpt2, kLlama, kQwen2, kQwen3, kMixtral, kQwen2Moe, kQwen3Moe };

/// The mixture of experts of Mixtral and Qwen2-MoE (loom's moe mlp with a topk softmax
/// router): E experts of width F, K per token.
struct HfMoe {
  int64_t experts = 0, topk = 0, ffn = 0;
  int64_t shared_ffn = 0;    ///< Qwen2-MoE's gated shared expert; 0: none (width 0 in Qwen2-MoE)
  bool renormalise = true;   ///< top-K probabilities summed to 1 (loom pre_softmax false)
  double aux_loss_coef = 0;  ///< router_aux_loss_coef <-> router.aux_loss_coeff, as is
  std::vector<bool> sparse;  ///< per layer: MoE, or the dense MLP of HfModel::ffn
};

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
  bool qkv_bias = false;     ///< loom's q/k/v biases (Qwen2 and Qwen2-MoE; the latter's files
                             ///< always have them: 0 if not)
  std::optional<HfMoe> moe;  ///< Mixtral, Qwen2-MoE and Qwen3-MoE
  bool qk_norm = false;      ///< Qwen3's and Qwen3-MoE's q_norm / k_norm (D) <-> qk_layernorm
};

/// "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
/// "MixtralForCausalLM", "Qwen2MoeForCausalLM" or "Qwen3MoeForCausalLM".
const char* hf_architecture(HfFamily family);

/// The model of a loom checkpoint's metadata (kinds/checkpoint_format.h): its spec's
/// "model" node, spec.train.seq_length for a null max_position_embeddings, and the eod id
/// (spec.data.eod_id, or metadata.trainer.tokenizer.eod / trainer.eod_id) as bos and eos.
/// Refuses a model none of the families can express with kUnimplemented naming the field.
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
