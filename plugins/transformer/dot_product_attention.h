// DotProductAttention (kinds::kAttention "dot_product"): the reference attention core,
// built from ops the way Megatron's DotProductAttention is built from torch ops:
//   S = Q K^T (batched gemm, head-major), P = masked_softmax(scale * S), P' = dropout(P),
//   O = P' V.
// Query head h reads key/value group h / (H / G): with heads laid out head-major the H/G
// heads of a group are contiguous, so Q (B, H, T, D) is seen as (B, G, H/G * T, D) and each
// gemm is batched over (B, G) without copying K or V.
//   forward:  [0] q (B, T, H, D), [1] k (B, S, G, D), [2] v (B, S, G, D),
//             [3] segment ids (B, T) i32 or empty, [4] bias (unsupported: must be empty)
//             -> [0] out (B, T, H, D)
//   backward: dout -> dq, dk, dv
// Attention 1.2: q, k, v may be the views of one fused QKV tensor; this core copies them into
// packed tensors (split_qkv) and returns packed gradients.
// Recompute kSelective: P is not saved but recomputed in backward from Q and K.
// Context parallelism (parallel.cp > 1): the ring needs each block's log-sum-exp, which this
// core's softmax does not give, so the blocks go through the fused attention_fwd /
// attention_bwd ops (ContextParallelAttention, loom/cpp/nn/context_parallel.h).
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class DotProductAttention final : public ModuleBase<IAttention> {
 public:
  DotProductAttention(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  // P = softmax(scale * Qh Kh^T + mask), (B, H, T, S).
  TensorView probabilities(IForwardContext& ctx, const TensorView& qh, const TensorView& kh,
                           const TensorView& segments) const;
  // (B, I, J, D) -> (B, J, I, D), freshly allocated.
  TensorView swap(IForwardContext& ctx, const TensorView& x) const;
  float scale_for(int64_t head_dim) const;

  bool causal_;
  double softmax_scale_;  // <= 0: 1 / sqrt(D)
  float dropout_p_;
  uint64_t dropout_stream_ = 0;  // the random stream's purpose (per tensor-parallel rank)
  DType dtype_;
  Device device_;
  Kernel gemm_, softmax_fwd_, softmax_bwd_, dropout_fwd_, dropout_bwd_, swap_;
  Kernel split_;                 // packed copies of fused q, k, v views (attention 1.2)
  ContextParallelAttention cp_;  // active with parallel.cp > 1
  ops::AttentionAttrs cp_attrs(IForwardContext& ctx, int64_t head_dim) const;
};

}  // namespace loom::transformer
