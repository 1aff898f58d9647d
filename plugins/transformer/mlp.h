// Mlp (kinds::kMlp "mlp"): Megatron's dense feed-forward block,
//   y = fc2(act(fc1(x))), fc1: C -> F (2F for swiglu: [gate; up]), fc2: F -> C.
// Parameters (Megatron-Core names): linear_fc1.weight (F, C), or (2, F, C) for swiglu
// ([gate; up], as rows the (2F, C) matrix), linear_fc1.bias (F | (2, F)), linear_fc2.weight
// (C, F), linear_fc2.bias (C) (biases when add_bias_linear).
//   forward:  [0] x (..., C) -> [0] y (..., C)
//   backward: dy -> dx; parameter gradients accumulated
// Tensor parallelism (the "tp" group of size P, F divisible by P): fc1 is column-parallel
// (rank r holds units [r F/P, (r + 1) F/P) of the gate and of the up projection alike),
// fc2 row-parallel (its output summed over the group, the bias added after the sum). With
// sequence parallelism x and y are sequence shards (B, T/P, C): x is gathered before fc1
// and the output reduce-scattered.
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/transformer/linear.h"
#include "plugins/transformer/module_base.h"
#include "plugins/transformer/tensor_parallel.h"

namespace loom::transformer {

class Mlp final : public ModuleBase<IMlp> {
 public:
  Mlp(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  enum class Activation { kGelu, kGeluTanh, kSwiglu };
  Activation activation_;
  int64_t hidden_, ffn_;
  TensorParallel tp_;
  int64_t local_ffn_, fc1_out_;  // this rank's F / P and its fc1 rows (F/P or 2F/P)
  bool bias_;
  DType dtype_;
  Device device_;
  int32_t fc1_weight_, fc1_bias_ = -1, fc2_weight_, fc2_bias_ = -1;
  Linear linear_;
  Kernel act_fwd_, act_bwd_;
};

}  // namespace loom::transformer
