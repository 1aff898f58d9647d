// FusedAttention (kinds::kAttention "fused"): the attention core as one op, attention_fwd /
// attention_bwd (loom/ops.h), in the manner of TransformerEngine's fused attention and
// FlashAttention: fast kernels never materialise the (T, S) scores; forward keeps only O and
// the row log-sum-exp for backward. Dropout uses the same Philox stream (purpose 1 of this
// module) and element numbering as the reference "dot_product" core, so both give the same
// result for the same seed. Built on the SDK's module toolkit (loom/cpp/nn.h).
//   forward:  [0] q (B, T, H, D), [1] k (B, S, G, D), [2] v (B, S, G, D),
//             [3] segment ids (B, T) i32 or empty, [4] bias (unsupported: must be empty)
//             -> [0] out (B, T, H, D)
//   backward: dout -> dq, dk, dv
// Attention 1.2: q, k, v may be the views of one fused QKV tensor (loom/cpp/nn/qkv_views.h);
// the ops read them in place, and backward returns dq, dk, dv as the same views of one new
// tensor. With context parallelism they are copied first (the ring sends packed k and v).
#pragma once

#include <loom/cpp/nn.h>

#include <nlohmann/json.hpp>

namespace loom::fused_attention {

class FusedAttention final : public nn::ModuleBase<IAttention> {
 public:
  FusedAttention(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  ops::AttentionAttrs attrs(IForwardContext& ctx, int64_t head_dim) const;

  bool causal_;
  double softmax_scale_;  // <= 0: 1 / sqrt(D)
  float dropout_p_;
  uint64_t dropout_stream_ = 0;  // the random stream's purpose (per tensor-parallel rank)
  DType dtype_;
  Device device_;
  Kernel fwd_, bwd_;
  Kernel split_;                     // packed copies of fused q, k, v views for context parallelism
  nn::ContextParallelAttention cp_;  // active with parallel.cp > 1
};

}  // namespace loom::fused_attention
