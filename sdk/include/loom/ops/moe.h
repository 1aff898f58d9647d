// Mixture of experts: router top-k, token permutation and the grouped GEMM of the experts.
// Part of the op catalogue: loom/ops.h states the conventions every op follows (layouts,
// dtypes, "+=" outputs, the random stream) and includes every family.
//
// N = tokens, E = experts, K = experts per token (top-k), M = rows after permutation (the
// (token, expert) pairs routed to the experts at hand, grouped by expert), C = row width.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Mixture of experts
// ---------------------------------------------------------------------------------------

/// "moe_topk": a router's choice of K experts per token from its logits (Megatron-Core's
/// topk_routing_with_score_function), in f32 or f64 (the router dtype, Megatron's
/// --moe-router-dtype): every kernel computes in f64 and rounds the outputs to the logits'
/// dtype last.
///   inputs:  [0] logits f32 | f64 (N, E), [1] expert bias f32 (E) or empty (sigmoid only:
///            added to the scores for the selection, never to the probabilities; f32 whatever
///            the logits' dtype, as Megatron keeps its expert_bias buffer)
///   outputs: [0] probs (N, K) of the logits' dtype, [1] experts i32 (N, K), [2] lse (N) of
///            the logits' dtype or empty: the logsumexp of each row of logits (for the z-loss)
///            (an f64 router hands the MoE layer f32 probs through a cast after this op, as
///            Megatron casts the f64 probs where they meet the experts' activations)
/// Selection score and probabilities by `score`:
///   softmax, pre_softmax 0: select on the logits; probs = softmax over the K selected logits
///   softmax, pre_softmax 1: s = softmax over all E; select on s; probs = s (not renormalised)
///   sigmoid:                s = sigmoid(logits); select on s + bias; probs = s / (sum of
///                           the K selected s + 1e-20) when K > 1, s when K = 1
/// With num_groups G > 1 (group-limited routing, DeepSeek-V3) the E experts form G groups of
/// E / G; a group's score is the sum of its top K / group_topk selection scores; only the
/// experts of the group_topk best groups can be selected. Then probs *= scaling_factor.
/// Each row's experts are in descending order of selection score; ties go to the lower
/// expert id (and to the lower group id), on every device.
/// "moe_topk_bwd": the gradient of the logits from that of probs (and of lse).
///   inputs:  [0] dprobs (N, K), [1] logits f32 | f64 (N, E), [2] experts i32 (N, K)
///            (forward's output [1]), [3] dlse (N) or empty
///   outputs: [0] dlogits (N, E) (overwritten)
///   every float tensor of the call has the logits' dtype (f32 or f64).
/// Both take MoeTopkAttrs; they are keyed on the logits' dtype, f32 or f64.
inline constexpr const char* kMoeTopk = "moe_topk";
inline constexpr const char* kMoeTopkBwd = "moe_topk_bwd";
struct MoeTopkAttrs {
  int32_t k;            ///< K, in [1, E]
  int32_t score;        ///< 0 softmax, 1 sigmoid
  int32_t pre_softmax;  ///< softmax only: 1 selects on the softmax over all experts
  int32_t num_groups;   ///< G: 1 (or 0) for no group limit; must divide E
  int32_t group_topk;   ///< groups kept (in [1, G]); K must be a multiple of it
  float scaling_factor;  ///< multiplies probs; 0 means 1
};

/// "moe_permute": gathers rows, Y[j] = X[src[j]] (the dispatch of tokens to expert rows).
///   inputs:  [0] X float (N, C), [1] src i32 (M), each in [0, N)
///   outputs: [0] Y float (M, C), X's dtype
inline constexpr const char* kMoePermute = "moe_permute";

/// "moe_unpermute": each token sums its rows, weighted: X[t] = sum over k with
/// slot_rows[t, k] >= 0 of w[t, k] * Y[slot_rows[t, k]], added in k order (a token with no
/// row gets zeros). Without weights w = 1 (then it is also the backward of moe_permute,
/// slot_rows listing the rows each token was gathered into).
///   inputs:  [0] Y float (M, C), [1] slot_rows i32 (N, K): the row of each (token, choice),
///            -1 when the choice was dropped, [2] weights f32 (N, K) or empty
///   outputs: [0] X float (N, C), Y's dtype
/// "moe_unpermute_bwd":
///   inputs:  [0] dX float (N, C), [1] Y float (M, C) (needed only for dweights),
///            [2] slot_rows i32 (N, K), [3] weights f32 (N, K) or empty,
///            [4] row_slots i32 (M): the slot t * K + k that reads each row, -1 for none
///   outputs: [0] dY float (M, C): w[s] * dX[s / K] for s = row_slots[j], zeros for -1,
///            [1] dweights f32 (N, K) or empty: <dX[t], Y[slot_rows[t, k]]>, 0 when dropped
inline constexpr const char* kMoeUnpermute = "moe_unpermute";
inline constexpr const char* kMoeUnpermuteBwd = "moe_unpermute_bwd";

/// "grouped_gemm": one GEMM per expert over its run of rows. Group g owns the rows
/// [r_g, r_g + m_g) of X and Y, r_g = m_0 + ... + m_(g-1); its weight W_g lives at
/// attrs.weights[g] (every W_g has input [1]'s dtype, shape and device):
///   Y[rows g] = alpha * X[rows g] @ op(W_g) + beta * Y[rows g]
///   inputs:  [0] X float (M, Kd), [1] W_0 float (Nd, Kd) when trans_b, else (Kd, Nd)
///   outputs: [0] Y float (M, Nd); read only when beta != 0
/// A group with m_g = 0 rows is skipped.
/// "grouped_gemm_wgrad": the weight gradients, dW_g = alpha * dY[rows g]^T @ X[rows g] +
/// beta * dW_g, dW_g at attrs.weights[g] (each of output [0]'s dtype, shape and device; a
/// group with no rows gets beta * dW_g, so its gradient is zero, never stale).
///   inputs:  [0] dY float (M, Nd), [1] X float (M, Kd)
///   outputs: [0] dW_0 (Nd, Kd): the first group's (its data pointer is attrs.weights[0])
/// Both take GroupedGemmAttrs; group_rows and weights are host arrays read during the call.
inline constexpr const char* kGroupedGemm = "grouped_gemm";
inline constexpr const char* kGroupedGemmWgrad = "grouped_gemm_wgrad";
struct GroupedGemmAttrs {
  int32_t groups;             ///< G >= 1
  const int64_t* group_rows;  ///< (G) host array: m_g >= 0, summing to M
  void* const* weights;       ///< (G) host array of device pointers: W_g (or dW_g)
  int32_t trans_b;            ///< grouped_gemm: 1 when W_g is stored (Nd, Kd)
  float alpha;
  float beta;
};

}  // namespace loom::ops
