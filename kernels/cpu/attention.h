// Shapes, checks and cost of attention_fwd / attention_bwd, shared by the reference
// (attention.cc) and the fused kernel (flash_attention.cc). The argument checks and shape
// helpers live in the SDK (loom/cpp/op_checks/attention.h) so that every device refuses a
// bad call with the same words.
#pragma once

#include <loom/cpp/op_checks/attention.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {

using op_checks::attention_dropout_index;
using op_checks::attention_key_limit;
using op_checks::AttentionShape;

/// attention_merge's weights for one row (loom/ops/attention.h), in F (double for the
/// reference, float for the fast kernel): the merged log-sum-exp and the weights of the
/// running result (0 when it has none yet, lse = -inf) and of the block's. Only for a
/// block with a visible key (lse_part > -inf).
template <class F>
struct MergeWeights {
  F merged, running, part;
};
template <class F>
MergeWeights<F> merge_weights(F lse, F lse_part) {
  const F m = std::max(lse, lse_part);
  const F merged = m + std::log(std::exp(lse - m) + std::exp(lse_part - m));
  return {merged, lse == -INFINITY ? F(0) : std::exp(lse - merged), std::exp(lse_part - merged)};
}

bool attention_fwd_supports(const OpCall* call);
bool attention_bwd_supports(const OpCall* call);
Status attention_fwd_cost(const OpCall* call, OpCost* out);
Status attention_bwd_cost(const OpCall* call, OpCost* out);

}  // namespace loom::kernels::cpu
