// GroupedMlp: the experts this rank owns (Megatron-Core's TEGroupedMLP / SequentialMLP), each
// a SwiGLU or GELU MLP without biases, y = fc2_g(act(fc1_g(x))), over its run of rows.
// Parameters (global expert ids g, so a checkpoint reshards across ep by name):
//   linear_fc1.weight{g} (F, C), or (2, F, C) for swiglu ([gate; up]); linear_fc2.weight{g}
//   (C, F); kParamExpert with expert_index g; F split over the expert-tensor-parallel group
//   (etp: fc1 by rows, column parallel; fc2 by columns, row parallel).
//   forward:  [0] rows (M, C) grouped by local expert, [1] rows per local expert (E_local)
//             i64 on the host -> [0] (M, C)
//   backward: (M, C) -> (M, C); weight gradients accumulated (a zero-row expert gets none)
// With etp > 1 (Megatron's expert tensor parallelism after the token dispatch): the etp ranks
// own the same experts and hold different rows; each gathers every etp rank's rows (an
// all-gather of uneven sizes), runs its slice of F over all of them, and the partial outputs
// are summed back to the rows' owners (a reduce-scatter of uneven sizes); backward the same
// in reverse. Any dispatcher works unchanged: it hands this module the rows of its local
// experts.
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

  // Y[rows g] = X[rows g] @ op(W_g) over groups of rows: `counts` holds rows per local
  // expert for each etp rank in turn (etp x E_local groups), group i uses expert i % E_local.
  void gemm_rows(const TensorView& x, const std::vector<int32_t>& weights, bool trans_b,
                 const std::vector<int64_t>& counts, const TensorView& y) const;
  // dW_g (+)= dY[rows g]^T X[rows g], the same groups: each expert's gradient overwritten by
  // its first write of the step (kParamGradOverwrite, grad_write_beta), added to after.
  void gemm_wgrad(IForwardContext& ctx, const TensorView& dy, const TensorView& x,
                  const std::vector<int32_t>& weights, const std::vector<int64_t>& counts) const;
  // The one beta of a grouped_gemm_wgrad call, which writes every local expert's gradient
  // (an expert without rows in it gets beta * dW_g): 0 when the call is the step's first
  // write of all of them; else 1, after zeroing those it writes first (none, as the calls
  // come: each writes all experts).
  float grouped_write_beta(IForwardContext& ctx, const std::vector<int32_t>& weights) const;
  std::vector<int64_t> counts_of(const TensorView& t, int64_t rows) const;
  // Rows per local expert of every etp rank (etp x E_local), from this rank's.
  std::vector<int64_t> gather_counts(const std::vector<int64_t>& counts) const;
  // (M, C) of this rank -> (sum over etp ranks of M_r, C), rank by rank; x itself at etp 1.
  TensorView gather_rows(IForwardContext& ctx, const TensorView& x,
                         const std::vector<int64_t>& all_counts, const char* what) const;
  // The reverse, summing: (sum M_r, C) partial on every etp rank -> (M, C) of this rank,
  // the sum over etp ranks in rank order.
  TensorView sum_rows(IForwardContext& ctx, const TensorView& x,
                      const std::vector<int64_t>& all_counts, const char* what) const;

  IHost& host_;
  bool swiglu_, gelu_tanh_, grouped_;
  int64_t hidden_, ffn_, local_, first_;  // ffn_: this rank's slice of F
  DType dtype_;
  Device device_;
  ICommunicator* etp_;              // the ranks splitting each expert's F
  std::vector<int32_t> fc1_, fc2_;  // parameter indices per local expert
  Kernel grouped_gemm_, grouped_wgrad_, gemm_, act_fwd_, act_bwd_, add_;
};

}  // namespace loom::moe
