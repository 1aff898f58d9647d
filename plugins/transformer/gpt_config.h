// GptConfig: the model-level configuration of the "gpt" model, read from its options (its
// own spec keys plus what the core hands the root model: seq_length, micro_batch_size,
// params_dtype, device, return_logits) and validated as a whole, up front, before any
// child is built (as Megatron's TransformerConfig.__post_init__ does). Every rule that is
// broken throws kInvalidArgument with the spec key, the rule and the fix.
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::transformer {

struct GptConfig {
  int64_t num_layers, hidden_size, num_attention_heads, num_query_groups, kv_channels;
  int64_t ffn_hidden_size, vocab_size, max_position_embeddings;
  /// Megatron's make_vocab_size_divisible_by, and the rows of the embedding and output
  /// tables: vocab_size rounded up to a multiple of it times tp (set by GptModel, which knows
  /// tp; vocab_size until then). Rows from vocab_size on are padding (ParamInfo::valid_rows).
  int64_t make_vocab_size_divisible_by = 128, padded_vocab_size = 0;
  std::string position_embedding;  // "learned", "rope" or "none"
  nlohmann::json rotary;           // {"base", "percent", "scaling": {...}}
  bool add_bias_linear, add_qkv_bias, tie_embeddings, return_logits;
  /// RMSNorm (the layer's norm kind) per head over kv_channels on q and k before rope
  /// (Megatron's --qk-layernorm, Qwen3's q_norm / k_norm).
  bool qk_layernorm = false;
  /// Multi-latent attention (DeepSeek-V2/V3, Megatron's --multi-latent-attention): the node
  /// {q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim}, or null.
  nlohmann::json multi_latent_attention;
  double init_std, hidden_dropout, attention_dropout;
  int64_t seq_length, micro_batch_size;
  /// Layers kept out of FP8 at either end (Megatron's --num-layers-at-start-in-bf16 /
  /// --num-layers-at-end-in-bf16); only matter in a run with an FP8 recipe.
  int64_t layers_at_start_in_bf16 = 0, layers_at_end_in_bf16 = 0;
  /// Which layers (0-based) take the layer node's "mlp" (a mixture of experts, say) and
  /// which its "dense_mlp": Megatron's --moe-layer-freq, an int N (layer i iff i % N == 0)
  /// or a 0/1 pattern of num_layers entries. Every layer by default.
  std::vector<bool> moe_layers;
  /// Megatron's --hybrid-layer-pattern (Mamba hybrids): one symbol per layer, M a Mamba
  /// layer (the model's "mamba_layer" node), * an attention-only layer, - an MLP-only layer
  /// (the layer node's dense_mlp), E a mixture-of-experts-only layer (its mlp, which must be
  /// a moe), and | a cut between pipeline stages (virtual stages in order; ignored on a run
  /// without pipeline parallelism). Empty: every layer is the layer node whole.
  std::string hybrid_layer_pattern;
  /// Per layer: the pattern's symbol, or 'T' (a whole transformer layer) without a pattern.
  std::string layer_kinds;
  /// Multi-token prediction (DeepSeek-V3, Megatron's --mtp-num-layers /
  /// --mtp-loss-scaling-factor; mtp.h): D extra depths after the final norm (0: off), and
  /// lambda, the weight of their mean loss.
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;
  bool sequence_parallel;    // from the core (parallel.sequence_parallel)
  std::string cp_comm_type;  // from the core (parallel.cp_comm_type)
  DType params_dtype;
  Device device;
  /// The pipeline stage this model is built as (the core's inherited "pipeline"; 0 of 1 and
  /// chunk 0 of 1 for the whole network), and the layers it owns: an even split of
  /// num_layers over pp_size * chunks virtual stages, virtual stage chunk * pp_size + pp_rank.
  int32_t pp_rank = 0, pp_size = 1, chunk = 0, chunks = 1;
  int64_t layer_begin = 0, layer_end = 0;
  bool first_stage() const { return chunk == 0 && pp_rank == 0; }
  bool last_stage() const { return chunk == chunks - 1 && pp_rank == pp_size - 1; }

  /// Reads and validates `options` (the merged options handed to the factory).
  static GptConfig from_options(const nlohmann::json& options);
  /// What the layer numbered `layer_number` (1-based, as in Megatron) inherits; numbers past
  /// num_layers are the multi-token prediction depths' layers (a whole layer with the last
  /// decoder layer's mlp kind, not FP8).
  nlohmann::json layer_options(int64_t layer_number) const;
};

}  // namespace loom::transformer
