// LayerNorm (kinds::kNorm "layernorm"): y = (x - mean) * rstd * weight + bias over the
// last dimension (C). Parameters: weight (C), bias (C), both without weight decay.
//   forward:  [0] x (..., C)  ->  [0] y (..., C)
//   backward: dy -> dx; dweight, dbias accumulated
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class LayerNorm final : public ModuleBase<INorm> {
 public:
  LayerNorm(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  int64_t hidden_;
  ops::NormAttrs attrs_;
  DType dtype_;
  Device device_;
  int32_t weight_, bias_;
  Kernel fwd_, bwd_;
};

}  // namespace loom::transformer
