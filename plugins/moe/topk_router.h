// TopkRouter (kinds::kRouter "topk"): Megatron-Core's TopKRouter. Scores each token's
// hidden state against every expert and picks K of them.
//   logits = x W^T in f32 (W: router.weight (E, C)), then the op moe_topk: softmax (over the
//   K chosen logits, or over all E with pre_softmax) or sigmoid scores (normalised over the
//   K chosen when K > 1), group-limited selection (num_groups, group_topk), a scaling
//   factor, and with enable_expert_bias the aux-loss-free bias (expert_bias (E) f32, added
//   to the sigmoid scores for the selection only, updated at each step's end).
// Load balancing (each a term of the objective whose gradient backward adds; its value is
// forward output [2], not part of the reported loss): aux_loss and seq_aux_loss (a list
// may combine them, each with its coefficient) on scores recomputed over all E with a top-K
// that ignores bias and groups, counts summed over the tensor x context group (the ranks
// holding parts of the same sequences), and the z-loss on the logits' logsumexp.
//   forward:  [0] x (N, C) -> [0] probs (N, K) f32, [1] experts (N, K) i32, [2] aux f32 ()
//   backward: [0] dprobs (N, K) f32 -> [0] dx (N, C); the load-balancing and z terms add
//             their gradient weighted by the context's aux_loss_weight (forward_context 1.5)
// With enable_expert_bias the step's token counts (the biased choice, before any capacity
// drop) are taken in backward, which runs once per micro-batch even under recomputation.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plugins/moe/toolkit.h"

namespace loom::moe {

class TopkRouter final : public ModuleBase<IRouter> {
 public:
  TopkRouter(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  void on_step_end(const StepEvent& event) override;

  enum class Balance { kAux, kSeqAux };
  struct BalanceTerm {
    Balance type;
    double coeff;
  };
  // The load-balancing terms of one micro-batch: value (this rank's share) and the
  // gradient of the aux scores (N, E) in the order moe_topk sorted them.
  double balance_terms(IForwardContext& ctx, const TensorView& logits, int64_t batch,
                       std::vector<float>* dscores, std::vector<int32_t>* order);

  IHost& host_;
  int64_t hidden_, experts_;
  ops::MoeTopkAttrs attrs_{};
  std::vector<BalanceTerm> balance_;
  double z_coeff_ = 0;
  bool expert_bias_ = false;
  double bias_rate_ = 0;
  int64_t seq_length_ = 0;  // tokens of one sequence on this rank (B = N / seq_length_)
  DType dtype_;
  Device device_;
  int32_t weight_, bias_ = -1;
  Kernel gemm_, topk_, topk_bwd_, add_, cast_;
  ICommunicator* sequence_group_ = nullptr;  // tp x cp: the ranks holding one sequence
  ICommunicator* count_group_ = nullptr;     // tp x cp x ep x dp: the expert bias's counts
  std::vector<double> step_counts_;          // tokens routed to each expert in this step
  std::string layer_;                        // "layer_3", for metric names
};

}  // namespace loom::moe
