// TransformerLayer (kinds::kLayer "transformer_layer"): Megatron's pre-norm decoder layer,
//   h = x + dropout(proj(core(rope(qk_norm(split(qkv(norm1(x))))))))
//   y = h + dropout(mlp(norm2(h)))
// Children (spec slots): "norm" (built twice: input_layernorm, pre_mlp_layernorm; twice more
// with qk_layernorm), "attention" (the core, self_attention.core_attention) and "mlp". The
// projections are the layer's own parameters, with Megatron-Core names:
//   self_attention.linear_qkv.weight ((H + 2G) * D, C), grouped [G, (H/G + 2) * D, C]
//   self_attention.linear_qkv.bias   ((H + 2G) * D)          when add_qkv_bias
//   self_attention.linear_proj.weight (C, H * D)
//   self_attention.linear_proj.bias   (C)                    when add_bias_linear
// qk_layernorm (Megatron's --qk-layernorm, Qwen3's q_norm / k_norm): the "norm" node built
// over the head dimension, self_attention.q_layernorm and .k_layernorm (weight (D), shared
// by all heads), normalises every head of q (B, T, H, D) and k (B, T, G, D) after the split
// and before rope, so the kv cache holds normed, rotated keys. With tensor parallelism each
// rank normalises its own heads only, so its gradient of the replicated weight is partial:
// the weight carries kParamSequenceParallel (gradient all-reduced over the tp group) whether
// or not the run is sequence parallel. Context parallelism needs nothing (per token).
//   forward:  [0] hidden (B, T, C), [1] position ids (B, T) i32 or empty,
//             [2] segment ids (B, T) i32 or empty -> [0] (B, T, C)
// With a kv cache in the context (incremental decoding, IForwardContext::kv_cache) k (after
// rope) and v of the T new tokens are appended to the cache and the core attends over all
// past + T positions; position ids are then required past position 0 and segment ids are
// refused.
//   backward: dy -> dx (and an empty gradient for the position ids)
// Hybrid layer patterns (the model's hybrid_layer_pattern, Megatron's MambaStack): with
// has_attention false the layer is y = x + dropout(mlp(norm2(x))) ("-" and "E": no
// input_layernorm, no self_attention.*), with has_mlp false y = x + dropout(proj(core(...)))
// ("*": no pre_mlp_layernorm, no mlp.*); both default to true.
// Multi-latent attention (the model's multi_latent_attention, DeepSeek-V2/V3): the attention
// half is the "self_attention" child MlaSelfAttention (mla_attention.h) between the input norm
// and the tensor-parallel sum; linear_proj's bias stays the layer's.
// Residual adds fused into the norms (norm 1.2, loom/kinds/model.h): h = x + attn is
// pre_mlp_layernorm's residual input (it returns norm2(h) and h), and in backward each norm
// adds the residual stream's gradient into its input gradient. A norm older than 1.2 gets
// the unfused adds.
// FP8 (a run with /precision/fp8): the QKV and output projections are FP8 sites of nn::Linear.
// Under a recipe that gives producers (delayed scaling), on a device with the kernel, a rope
// layer without q/k norms, YaRN's scale or a QKV bias turns the QKV output gradient back and
// quantises it for the projection's FP8 GEMMs in one op (rope_fp8_bwd): the bits of rope_bwd
// then the quantisation, without the rotated tensor. A spec pin "rope_fp8_bwd": "none"
// restores the two.
// Recompute kFull: only the input is saved; backward reruns forward, then goes back.
// Split backward (IForwardContext::defer_weight_grads): the projections' weight gradients
// wait for backward_weight.
// Tensor parallelism (the "tp" group of size P): linear_qkv is column-parallel (each rank
// holds G/P whole query groups, so H and G must be divisible by P), the core attends over
// the rank's H/P heads, linear_proj is row-parallel (its output summed over the group, the
// bias added after the sum). With sequence parallelism the hidden states in and out are
// sequence shards (B, T/P, C) and the norms, dropout and residual adds run on them.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "plugins/transformer/mla_attention.h"
#include "plugins/transformer/rotary.h"
#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class TransformerLayer final : public ModuleBase<ILayer> {
 public:
  TransformerLayer(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  // Zero-bubble split: the QKV and output projections' weight gradients (and the QKV bias's)
  // wait for backward_weight; the norms and the projection bias are computed in backward,
  // except with one rank, where the projection's bias rides on its GEMMs
  // (proj_bias_on_gemm) and its gradient waits with the projection's weight gradient.
  bool defers_weight_grads() const override { return true; }
  void run_backward_weight(IForwardContext& ctx) override;
  // One tensor-parallel rank and loom's own attention projection: linear_proj's bias is
  // added by its GEMM (gemm_epilogue where a kernel serves it) and summed with its weight
  // gradient, not after the group sum.
  bool proj_bias_on_gemm() const;
  // linear_proj's bias gradient when proj_bias_on_gemm, else empty.
  TensorView proj_bias_grad() const;
  // The forward proper; saves through `ctx` what backward needs.
  TensorView forward_impl(IForwardContext& ctx, const TensorView& x, const TensorView& positions,
                          const TensorView& segments);
  // The attention half: attn = dropout(proj(core(...))) (a new tensor, the branch's output
  // before the residual add), and its backward from the residual's gradient to dx (a new
  // tensor; dresidual is the caller's).
  TensorView attention_forward(IForwardContext& ctx, const TensorView& x,
                               const TensorView& positions, const TensorView& segments);
  TensorView attention_backward(IForwardContext& ctx, const TensorView& dresidual);
  // dropout(sum over tp of attn_partial + bias): the attention half's tail.
  TensorView attention_output(IForwardContext& ctx, const TensorView& attn_partial);
  // True when backward turns the QKV output gradient back by rope and quantises it for the
  // projection's FP8 GEMMs in one op (rope_fp8_bwd; the header comment says when).
  bool quantizes_rope_grad() const;
  // The input norm's backward: dx = dresidual + d norm1(x) / dx, fused where the norm can.
  TensorView input_norm_backward(IForwardContext& ctx, const TensorView& dresidual,
                                 const TensorView& dnormed);
  // Hidden dropout of `x` in place (forward) and its gradient (backward, a new tensor), with
  // the random stream `purpose`; identity outside training or when the probability is 0.
  void dropout_forward(IForwardContext& ctx, const TensorView& x, uint64_t purpose) const;
  TensorView dropout_backward(IForwardContext& ctx, const TensorView& dy, uint64_t purpose) const;

  int64_t hidden_, heads_, groups_, head_dim_;
  TensorParallel tp_;
  int32_t cp_rank_ = 0, cp_size_ = 1;   // the context-parallel group (dropout follows the chunks)
  int64_t local_heads_, local_groups_;  // this rank's share of heads_ and groups_
  bool qkv_bias_, proj_bias_, qk_layernorm_;
  bool has_attention_, has_mlp_;  // a hybrid pattern's * and - layers have one half each
  float hidden_dropout_;
  DType dtype_;
  Device device_;
  int32_t rotary_dim_ = 0;
  std::unique_ptr<RotaryTable> inv_freq_;  // null without rope
  float rope_mscale_ = 1.0f;  // YaRN's attention factor on cos and sin: q, k scaled after rope
  int32_t qkv_weight_ = -1, qkv_bias_index_ = -1, proj_weight_ = -1, proj_bias_index_ = -1;
  IModule *input_norm_ = nullptr, *core_ = nullptr, *pre_mlp_norm_ = nullptr, *mlp_ = nullptr;
  IModule *q_norm_ = nullptr, *k_norm_ = nullptr;               // with qk_layernorm
  bool fused_input_norm_ = false, fused_pre_mlp_norm_ = false;  // norm 1.2: residual fused in
  bool fused_qkv_ = false;           // attention 1.2: q, k, v as views of the QKV projection (MHA)
  MlaSelfAttention* mla_ = nullptr;  // multi-latent attention (child "self_attention")
  Linear linear_;
  Kernel split_, merge_, rope_fwd_, rope_bwd_, rope_scale_, add_, dropout_fwd_, dropout_bwd_;
  Kernel rope_fp8_bwd_;  // resolved for an FP8 rope layer where a kernel serves it
};

}  // namespace loom::transformer
