// TopkRouter (kinds::kRouter "topk"): Megatron-Core's TopKRouter. Scores each token's
// hidden state against every expert and picks K of them.
//   logits = x W^T (W: router.weight (E, C)) in the router dtype, then the op moe_topk:
//   softmax (over the K chosen logits, or over all E with pre_softmax) or sigmoid scores
//   (normalised over the K chosen when K > 1), group-limited selection (num_groups,
//   group_topk), a scaling factor, and with enable_expert_bias the aux-loss-free bias
//   (expert_bias (E) f32, added to the sigmoid scores for the selection only, updated at each
//   step's end).
// Router dtype (Megatron's --moe-router-dtype): "fp32" (default) computes the logits in f32
// through the gemm and moe_topk kernels; "fp64" runs the same kernels on f64 tensors: x and W
// cast to f64, an f64 gemm, moe_topk / moe_topk_bwd on f64 logits, and the backward's GEMMs
// in f64 (dW accumulated into the parameter's gradient with one rounding), on any device whose
// kernel library has the f64 gemm, cast, add and router ops (cpu, cuda). Either way the probs
// handed to the MoE layer are f32 (cast from f64 under fp64) and dx has the input's dtype.
// Load balancing (each a term of the objective whose gradient backward adds; its value is
// forward output [2], not part of the reported loss): aux_loss, seq_aux_loss and
// global_aux_loss (a list may combine them, each with its coefficient) on scores recomputed
// over all E with a top-K that ignores bias and groups, and the z-loss on the logits'
// logsumexp. aux_loss and seq_aux_loss count tokens over the tensor x context group (the
// ranks holding parts of the same sequences); global_aux_loss over every rank holding other
// tokens of this layer (tensor x context x expert x data) and over the step's micro-batches
// so far (running average, reset at step_end).
//   forward:  [0] x (N, C) -> [0] probs (N, K) f32, [1] experts (N, K) i32, [2] aux f32 ()
//   backward: [0] dprobs (N, K) f32 -> [0] dx (N, C); the load-balancing and z terms add
//             their gradient weighted by the context's aux_loss_weight (forward_context 1.5)
// With enable_expert_bias the step's token counts (the biased choice, before any capacity
// drop) are taken in backward, which runs once per micro-batch even under recomputation.
#pragma once

#include <map>
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

  enum class Balance { kAux, kSeqAux, kGlobalAux };
  struct BalanceTerm {
    Balance type;
    double coeff;
  };
  // The load-balancing terms of one micro-batch: value (this rank's share) and its gradient.
  // \param scores   (N, E) the aux scores of each row sorted best first (moe_topk over all E)
  // \param order    (N, E) the experts of those scores; the first K of a row are its top-K
  // \param batch    B, sequences in the N tokens (seq_aux_loss)
  // \param dscores  out (N, E): d(value) / d(scores), in the same sorted order
  double balance_terms(IForwardContext& ctx, const std::vector<double>& scores,
                       const std::vector<int32_t>& order, int64_t batch,
                       std::vector<double>* dscores);
  // global_aux_loss's tokens per expert for this micro-batch: `counts` (E) summed over the
  // count group, added once per micro-batch to the step's running sum, divided by the number
  // of micro-batches counted so far in the step (Megatron's global_tokens_per_expert / ga_steps).
  std::vector<double> global_average(IForwardContext& ctx, std::vector<double> counts);
  // The f64 router's backward GEMMs (dtype fp64): router.weight's gradient += dlogits^T x and
  // the returned dx = dlogits W, both in f64, from dlogits (N, E) f64 and the input x (N, C).
  TensorView backward_gemms_f64(IForwardContext& ctx, const TensorView& x,
                                const TensorView& dlogits);

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
  bool f64_ = false;                  // dtype fp64
  DType router_dtype_ = DType::kF32;  // the logits' dtype: f32, or f64 under fp64
  int32_t weight_, bias_ = -1;
  Kernel gemm_, topk_, topk_bwd_, add_, cast_;
  ICommunicator* sequence_group_ = nullptr;  // tp x cp: the ranks holding one sequence
  ICommunicator* count_group_ = nullptr;     // tp x cp x ep x dp: every rank with other tokens
  std::vector<double> step_counts_;          // tokens routed to each expert in this step
  // global_aux_loss's running state over the step's micro-batches (reset by step_end). It
  // lives in the module, not in a forward context, because it spans the step's micro-batches
  // (several may be in flight under a pipeline schedule), as Megatron's
  // global_tokens_per_expert / ga_steps buffers do.
  struct GlobalSeen {
    std::vector<double> counts;   // (E) the micro-batch's counts over the count group
    std::vector<double> average;  // (E) the running average its terms used
  };
  std::vector<double> global_sum_;             // (E) counts summed over the micro-batches so far
  int64_t global_micro_batches_ = 0;           // micro-batches in global_sum_
  std::map<int32_t, GlobalSeen> global_seen_;  // by IForwardContext::micro_batch()
  std::string layer_;                          // "layer_3", for metric names
};

}  // namespace loom::moe
