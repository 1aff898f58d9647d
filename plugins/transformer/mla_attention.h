// MlaSelfAttention: multi-latent attention (DeepSeek-V2/V3, Megatron-Core's MLASelfAttention),
// the attention half of a transformer layer whose model sets multi_latent_attention. Built
// by TransformerLayer as its "self_attention" child, from the normed hidden states to the
// output projection (before the tensor-parallel sum):
//   with q_lora_rank:  q = (RMSNorm_q(x Wdq^T)) Wuq^T          else q = x Wq^T   (B, T, H, dn + dr)
//   [c_kv ; k_pe] = x Wdkv^T;  kv = RMSNorm_kv(c_kv) Wukv^T                       (B, T, H, dn + dv)
//   Q, K, V = mla_qkv(q, kv, k_pe): rotary part first, k_pe shared by the heads, V padded to
//   D = dr + dn; rope (rotary_dim dr) on Q and K (and YaRN's attention factor on all of Q
//   and K: DeepSeek's mscale^2 on the softmax scale; k_pe is rotated before it is spread over
//   the heads); O = core(Q, K, V) with the softmax
//   scale 1/sqrt(D); out = mla_out(O) Wo^T.
// Children: "core_attention" (the layer node's attention), "q_layernorm" (with q_lora_rank)
// and "kv_layernorm" (the layer node's norm kind over q_lora_rank / kv_lora_rank).
// Parameters (Megatron-Core's names without Transformer Engine's fusions):
//   linear_q_down_proj.weight (q_lora, C)  and linear_q_up_proj.weight (H (dn + dr), q_lora),
//   or linear_q_proj.weight (H (dn + dr), C);
//   linear_kv_down_proj.weight (kv_lora + dr, C), linear_kv_up_proj.weight (H (dn + dv), kv_lora),
//   linear_proj.weight (C, H dv) (its bias, when add_bias_linear, is the layer's).
// Needs position_embedding rope; qk_pos_emb_head_dim >= 2 and even.
// Per head the up-projections' rows are [q_nope ; q_pe] and [k_nope ; v], as Megatron's.
//   forward:  [0] x (B, T, C) the whole sequence (after the layer's norm and tensor-parallel
//             entry), [1] position ids (B, T) or empty, [2] segment ids or empty
//             -> [0] (B, T, C): this rank's heads' share of the output projection
//   backward: d(out) -> dx (B, T, C) (this rank's share: the layer sums it over tp)
// Tensor parallelism (size P): the up-projections are column-parallel over heads (H / P per
// rank) and linear_proj row-parallel; the down-projections and the latent norms are
// replicated, and since each rank's latent gradients come from its heads only, their weights
// carry kParamSequenceParallel (gradients summed over the tp group), as Megatron's duplicated
// down-projections. Incremental decoding caches the compressed latents of every position,
// RMSNorm_kv(c_kv) and the rotated k_pe (kv_lora_rank + qk_pos_emb_head_dim values shared by
// the heads, as DeepSeek's and Megatron's latent cache), and expands the cached positions'
// keys and values through linear_kv_up_proj in each pass.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "plugins/transformer/rotary.h"
#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

/// The MLA dimensions (the model's multi_latent_attention node).
struct MlaDims {
  int64_t q_lora_rank = 0;  ///< 0: no query compression (linear_q_proj)
  int64_t kv_lora_rank = 0, nope_dim = 0, rope_dim = 0, v_dim = 0;
  /// Reads and validates the node; throws with "/multi_latent_attention/..." pointers.
  static MlaDims from_json(const nlohmann::json& node);
  int64_t qk_dim() const { return nope_dim + rope_dim; }
};

class MlaSelfAttention final : public ModuleBase<IGenericModule> {
 public:
  /// \param options  the layer's options (hidden_size, num_attention_heads, init_std,
  ///                 num_layers, position_embedding, rotary, attention_dropout, params_dtype,
  ///                 device, sequence_parallel, multi_latent_attention)
  /// \param ctx      the layer's build context: the children come from its "attention" and
  ///                 "norm" nodes
  /// \param tp       the layer's tensor-parallel group
  MlaSelfAttention(const nlohmann::json& options, IBuildContext& ctx, const TensorParallel& tp);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  ops::MlaAttrs attrs() const;

  IHost* host_;
  MlaDims dims_;
  int64_t hidden_, heads_, local_heads_;
  DType dtype_;
  Device device_;
  std::unique_ptr<RotaryTable> inv_freq_;  // rope over the first rope_dim channels
  float rope_mscale_ = 1.0f;
  int32_t q_down_ = -1, q_up_ = -1, q_proj_ = -1, kv_down_, kv_up_, out_proj_;
  IModule *core_ = nullptr, *q_norm_ = nullptr, *kv_norm_ = nullptr;
  Linear linear_;
  Kernel gemm_, qkv_, qkv_bwd_, out_, out_bwd_, rope_fwd_, rope_bwd_, scale_;
};

}  // namespace loom::transformer
