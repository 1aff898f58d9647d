// GroupedMlp: the experts this rank owns (Megatron-Core's TEGroupedMLP / SequentialMLP), each
// a SwiGLU or GELU MLP without biases, y = fc2_g(act(fc1_g(x))), over its run of rows.
// Parameters (global expert ids g, so a checkpoint reshards across ep by name):
//   linear_fc1.weight{g} (F, C), or (2, F, C) for swiglu ([gate; up]); linear_fc2.weight{g}
//   (C, F); kParamExpert with expert_index g.
//   forward:  [0] rows (M, C) grouped by local expert, [1] rows per local expert (E_local)
//             i64 on the host -> [0] (M, C)
//   backward: (M, C) -> (M, C); weight gradients accumulated (a zero-row expert gets none)
// `grouped` runs every expert in one grouped_gemm call per GEMM; otherwise one gemm per
// expert (the sequential reference).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "plugins/moe/toolkit.h"

namespace loom::moe {

class GroupedMlp final : public ModuleBase<IGenericModule> {
 public:
  GroupedMlp(const nlohmann::json& options, IHost& host);

  int64_t local_experts() const { return local_; }

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  // Y[rows g] = X[rows g] @ op(W_g) (+ beta Y) over the local experts.
  void gemm_rows(const TensorView& x, const std::vector<int32_t>& weights, bool trans_b,
                 const std::vector<int64_t>& counts, const TensorView& y) const;
  // dW_g += dY[rows g]^T X[rows g].
  void gemm_wgrad(const TensorView& dy, const TensorView& x, const std::vector<int32_t>& weights,
                  const std::vector<int64_t>& counts) const;
  std::vector<int64_t> counts_of(const TensorView& t, int64_t rows) const;

  IHost& host_;
  bool swiglu_, gelu_tanh_, grouped_;
  int64_t hidden_, ffn_, local_, first_;
  DType dtype_;
  Device device_;
  std::vector<int32_t> fc1_, fc2_;  // parameter indices per local expert
  Kernel grouped_gemm_, grouped_wgrad_, gemm_, act_fwd_, act_bwd_;
};

}  // namespace loom::moe
