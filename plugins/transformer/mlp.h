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
// and the output reduce-scattered. In FP8 under delayed scaling, swiglu writes fc2's input
// straight into FP8 (swiglu_fp8_fwd) and, without biases, fc1's output gradient too
// (swiglu_fp8_bwd): the same bits as swiglu then quantisation, without the tensor between.
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class Mlp final : public ModuleBase<IMlp> {
 public:
  Mlp(const nlohmann::json& options, IBuildContext& ctx);

  /// True when backward quantises fc1's output gradient in swiglu's own kernel
  /// (swiglu_fp8_bwd), so no (N, 2F) gradient in the parameter dtype exists: an FP8 swiglu
  /// MLP without biases whose recipe gives producers (delayed scaling) and whose device has
  /// the kernel. The model's memory estimate asks.
  bool quantizes_swiglu_grad() const;

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  // Zero-bubble split: fc1's and fc2's weight gradients (and fc1's bias's) wait for
  // backward_weight; fc2's bias (added after the tensor-parallel sum) is computed in backward,
  // except with one rank, where it rides on fc2's GEMMs (fc2_bias_on_gemm).
  bool defers_weight_grads() const override { return true; }
  void run_backward_weight(IForwardContext& ctx) override;
  // fc1's bias gradient as the (F | 2F) vector the GEMM site writes, or empty.
  TensorView fc1_bias_grad() const;
  // One tensor-parallel rank: fc2's bias is added by fc2's GEMM and its gradient summed with
  // fc2's weight gradient (gemm_epilogue where a kernel serves it), not after the group sum.
  bool fc2_bias_on_gemm() const;
  // fc2's bias gradient when fc2_bias_on_gemm, else empty.
  TensorView fc2_bias_grad() const;
  // A GELU MLP whose site (kFc1Fp8: fc1's forward; kFc2Fp8: fc2's input gradient) fuses the
  // activation into its GEMM (Linear::fuses_activation).
  bool fused_gelu(int32_t site) const;
  // gelu's variant: 0 erf, 1 tanh.
  int32_t gelu_approximate() const;
  // A swiglu MLP that quantises the activation for fc2 in swiglu's kernel (swiglu_fp8_fwd):
  // fc2 is FP8 under a recipe that gives producers, and the device has the kernel.
  bool quantizes_swiglu() const;

  enum class Activation { kGelu, kGeluTanh, kSwiglu };
  Activation activation_;
  int64_t hidden_, ffn_;
  TensorParallel tp_;
  int64_t local_ffn_, fc1_out_;  // this rank's F / P and its fc1 rows (F/P or 2F/P)
  bool bias_;
  bool fc1_bias_in_dgelu_ = false;  // LOOM_FC1_BIAS_GRAD=dgelu: see the constructor
  DType dtype_;
  Device device_;
  int32_t fc1_weight_, fc1_bias_ = -1, fc2_weight_, fc2_bias_ = -1;
  Linear linear_;
  Kernel act_fwd_, act_bwd_;
  Kernel swiglu_fp8_fwd_, swiglu_fp8_bwd_;  // resolved for an FP8 swiglu MLP where served
};

}  // namespace loom::transformer
