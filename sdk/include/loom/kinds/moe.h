// MoE: kinds::kRouter and kinds::kMoeDispatcher.
//
// N = tokens on this rank (B*T), E = experts in total, K = experts per token (top-k),
// M = tokens after dispatch on this rank (sum of tokens per local expert).
#pragma once

#include "loom/kinds/module.h"

namespace loom {

/// Router: scores tokens and picks experts.
///   forward inputs:  [0] hidden (N, C)
///   forward outputs: [0] probs (N, K) f32 (the combine weights), [1] experts (N, K) i32,
///                    [2] aux loss, scalar f32 (0 when no load-balancing loss is used): this
///                    rank's share of the router's own terms of the objective, for display
///   backward:        [0] dprobs (N, K) f32 -> [0] dx (N, C); the router adds the gradient of
///                    its own terms itself, weighted by IForwardContext::aux_loss_weight
///                    (forward_context 1.5), so a caller passes no gradient for output [2]
/// The hidden input may also be (B, T, C) (a per-sequence loss needs B).
class IRouter : public IModule {
 protected:
  ~IRouter() = default;
};

/// Dispatcher: moves tokens to the ranks that own their experts and back. It holds no
/// parameters; its state for one micro-batch lives in the forward context.
class IMoeDispatcher : public IObject {
 public:
  /// Sends each token to its K experts.
  /// \param ctx                 micro-batch context (keeps the permutation for combine)
  /// \param hidden              (N, C)
  /// \param experts             (N, K) i32, global expert ids; -1 for a dropped choice (it
  ///                            goes nowhere and its combine weight is not read)
  /// \param[out] dispatched     (M, C), grouped by local expert
  /// \param[out] tokens_per_expert  (E_local,) i64 in host memory (kCpu): the rows of each
  ///                            local expert, what a grouped GEMM is sized by
  virtual Status dispatch(IForwardContext* ctx, const TensorView* hidden, const TensorView* experts,
                          TensorView* dispatched, TensorView* tokens_per_expert) noexcept = 0;
  /// Brings expert outputs back and sums them with the router's weights.
  /// \param expert_out  (M, C)
  /// \param probs       (N, K) f32
  /// \param[out] hidden (N, C)
  virtual Status combine(IForwardContext* ctx, const TensorView* expert_out,
                         const TensorView* probs, TensorView* hidden) noexcept = 0;
  /// Backward of combine: grad (N, C) -> grad of expert_out (M, C) and of probs (N, K).
  virtual Status combine_backward(IForwardContext* ctx, const TensorView* grad_hidden,
                                  TensorView* grad_expert_out, TensorView* grad_probs) noexcept = 0;
  /// Backward of dispatch: grad (M, C) -> grad of hidden (N, C).
  virtual Status dispatch_backward(IForwardContext* ctx, const TensorView* grad_dispatched,
                                   TensorView* grad_hidden) noexcept = 0;

 protected:
  ~IMoeDispatcher() = default;
};

}  // namespace loom
