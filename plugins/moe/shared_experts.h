// SharedExperts: the dense MLP every token also goes through (Megatron-Core's SharedExpertMLP,
// Qwen2-MoE's shared_expert, DeepSeek's shared experts), optionally gated per token:
//   y = fc2(act(fc1(x))) * (sigmoid(x . gate_weight) with shared_expert_gate, else 1)
// Parameters: linear_fc1.weight (Fs, C) or (2, Fs, C) for swiglu, linear_fc2.weight (C, Fs),
// gate_weight (1, C). Tensor parallelism as the dense MLP: fc1 column-parallel, fc2
// row-parallel, x and y sequence shards with sequence parallelism; the gate is computed on
// each rank's own tokens (its weight's gradient summed over the tensor group then).
//   forward:  [0] x (B, T, C) -> [0] y (B, T, C)
//   backward: dy -> dx; parameter gradients accumulated
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/moe/toolkit.h"

namespace loom::moe {

class SharedExperts final : public ModuleBase<IGenericModule> {
 public:
  SharedExperts(const nlohmann::json& options, IHost& host);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  IHost& host_;
  bool swiglu_, gelu_tanh_, gated_;
  int64_t hidden_, ffn_, local_ffn_;
  DType dtype_;
  Device device_;
  TensorParallel tp_;
  Linear linear_;
  int32_t fc1_, fc2_, gate_ = -1;
  Kernel act_fwd_, act_bwd_, gemm_, sigmoid_, sigmoid_bwd_, scale_rows_, scale_rows_bwd_, add_,
      cast_;
};

}  // namespace loom::moe
