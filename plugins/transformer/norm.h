// LayerNorm and RMSNorm (kinds::kNorm "layernorm", "rmsnorm"), over the last dimension (C):
//   layernorm: y = (x - mean) * rstd * weight + bias; parameters weight (C), bias (C)
//   rmsnorm:   y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps); parameter weight (C)
// Both without weight decay; "zero_centered_gamma" stores weight as (gamma - 1).
//
// The calling convention of norm 1.2 (loom/kinds/model.h):
//   forward:  [0] x (..., C), [1] r (..., C) or absent  ->  [0] y (..., C), [1] z (..., C)
//             With r, the norm is of z = x + r (rounded to the dtype), and z, the next
//             residual, is output [1]: the residual add fused into the norm (the ops
//             add_layernorm_fwd / add_rmsnorm_fwd where a kernel serves them, else add then
//             the norm).
//   backward: [0] dy, [1] dz or absent  ->  [0] dx
//             dz is the gradient that reaches the norm's input (z, or x without r) by its
//             other path; dx = the norm's input gradient + dz, the gradient of x and of r
//             alike (add_*norm_bwd, else the norm's backward then add): grad input [0]
//             serves both, and any further grad input is empty.
//   dweight (and dbias) accumulated.
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class NormModule : public ModuleBase<INorm> {
 protected:
  /// \param rms   true: RMSNorm; false: LayerNorm (with a bias)
  /// \param name  the component's name, first word of its messages
  NormModule(const nlohmann::json& options, IBuildContext& ctx, bool rms, const char* name);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  void check_input(const TensorView& v, const char* what) const;

  bool rms_;
  const char* name_;
  int64_t hidden_;
  ops::NormAttrs attrs_;
  DType dtype_;
  Device device_;
  int32_t weight_, bias_ = -1;  // bias_: LayerNorm only
  Kernel fwd_, bwd_;
  Kernel add_fwd_, add_bwd_;  // the fused residual ops, where a kernel serves them
  Kernel add_;                // their unfused fallback's add
};

class LayerNorm final : public NormModule {
 public:
  LayerNorm(const nlohmann::json& options, IBuildContext& ctx)
      : NormModule(options, ctx, false, "layernorm") {}
};

class RmsNorm final : public NormModule {
 public:
  RmsNorm(const nlohmann::json& options, IBuildContext& ctx)
      : NormModule(options, ctx, true, "rmsnorm") {}
};

}  // namespace loom::transformer
