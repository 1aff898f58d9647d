// MambaMixer (kinds::kMixer "mamba2"): the Mamba-2 mixer of Megatron-Core's MambaMixer and
// mamba_ssm's Mamba2, over d_inner = H * P channels in H heads of P, G groups of B and C with
// state dim N, convolution width W:
//   z   = x Wz^T                                  (B, T, H*P)   the gate
//   xBC = silu(conv1d(x Wxbc^T))                  (B, T, G, HG*P + 2N)   packed (loom/ops/mamba.h)
//   dt  = x Wdt^T                                 (B, T, H)
//   y   = ssd_scan(xBC, dt, A_log, D, dt_bias)    (B, T, H, P)   dt = softplus(dt + dt_bias)
//   out = rmsnorm_gated(y, z) Wout^T              (B, T, C)      norm over groups of H*P / G
// Parameters (Megatron-Core's names, but in_proj kept as its three parts so that every part
// has one layout that tensor parallelism splits contiguously):
//   in_proj_z.weight   (H*P, C)               rows head-major
//   in_proj_xbc.weight (G, HG*P + 2N, C)      each group's x rows, then its B and C rows
//   in_proj_dt.weight  (H, C)
//   conv1d.weight      (G, HG*P + 2N, W), conv1d.bias (G, HG*P + 2N)   (when conv_bias)
//   A_log (H), D (H), dt_bias (H)            no weight decay; A = -exp(A_log)
//   norm.weight        (H*P)                  no weight decay
//   out_proj.weight    (C, H*P)
// (Megatron's in_proj.weight is the rows of z, x, B, C, dt stacked; a converter permutes.)
// Initialisation as Megatron's: in_proj normal(init_std), out_proj normal(init_std /
// sqrt(2 num_layers)), conv1d uniform(+-1/sqrt(W)) (PyTorch's default), A = uniform(A_init_range),
// dt = exp(uniform(log dt_min, log dt_max)) floored at dt_init_floor and dt_bias =
// dt + log(-expm1(-dt)) (the inverse of softplus), D = 1, norm 1.
//   forward:  [0] hidden (B, T, C) (the sequence shard (B, T/P, C) with sequence parallelism)
//             -> [0] (B, T, C) like the input
//   backward: dy -> dx
// Tensor parallelism (the "tp" group of size P) as Megatron's Mamba TP: every rank holds G/P
// whole groups with their H/P heads: in_proj, conv1d, A_log, D, dt_bias and norm are split
// over heads / groups (the gated norm's groups never straddle ranks), out_proj is row-parallel
// (its output summed over the group). G and H must be divisible by P.
// Decoding (IForwardContext::kv_cache, forward_context 1.6): the mixer keeps two states in the
// cache, the convolution window (B, W - 1, Cc) of the layer's dtype and the SSM state
// (B, H, P, N) in f32; a pass with past_length() > 0 starts from them, and every pass leaves
// its end state there, so T tokens at once and T passes of one token give the same outputs.
// Packed documents (segment ids) would carry the state across documents: refused by the layer.
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/mamba/toolkit.h"

namespace loom::mamba {

class MambaMixer final : public ModuleBase<IMixer> {
 public:
  MambaMixer(const nlohmann::json& options, IBuildContext& ctx);

  Status init_param(int32_t index, uint64_t seed) noexcept override;

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  ops::SsdScanAttrs scan_attrs() const;
  // conv1d's weight (Cc, W) and bias (Cc) (or empty) as the op takes them.
  TensorView conv_weight() const;
  TensorView conv_bias() const;

  IHost* host_;
  int64_t hidden_, heads_, head_dim_, groups_, state_dim_, conv_width_, chunk_size_;
  int64_t local_heads_, local_groups_;  // this rank's share
  int64_t group_width_;                 // HG * P + 2N: one group's packed xBC channels
  double dt_min_, dt_max_, dt_floor_, a_min_, a_max_;
  float norm_eps_;
  bool conv_bias_;
  TensorParallel tp_;
  DType dtype_;
  Device device_;
  int32_t z_weight_, xbc_weight_, dt_weight_, conv_weight_, conv_bias_index_ = -1;
  int32_t a_log_, d_, dt_bias_, norm_weight_, out_weight_;
  Kernel gemm_, conv_, conv_bwd_, scan_, scan_bwd_, norm_, norm_bwd_;
};

}  // namespace loom::mamba
