// Shapes, checks and cost of attention_fwd / attention_bwd, shared by the reference
// (attention.cc) and the fused kernel (flash_attention.cc).
#pragma once

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {

struct AttentionShape {
  int64_t b, t, s, h, g, d;  // batch, queries, keys, query heads, kv heads, head dim
  ops::AttentionAttrs attrs;
};

AttentionShape check_attention_fwd(const OpCall* call, bool shapes_only);
AttentionShape check_attention_bwd(const OpCall* call, bool shapes_only);
bool attention_fwd_supports(const OpCall* call);
bool attention_bwd_supports(const OpCall* call);
Status attention_fwd_cost(const OpCall* call, OpCost* out);
Status attention_bwd_cost(const OpCall* call, OpCost* out);

// Philox element index of probability (b, h, t, s) (loom/ops.h, attention_fwd).
inline uint64_t attention_dropout_index(const AttentionShape& s, int64_t b, int64_t h, int64_t t,
                                        int64_t k) {
  return static_cast<uint64_t>(((b * s.h + h) * s.t + t) * s.s + k);
}

// Keys [0, limit) may be visible to query t (causal: s <= t + S - T); at most S, maybe <= 0.
inline int64_t attention_key_limit(const AttentionShape& s, int64_t t) {
  if (!s.attrs.causal) return s.s;
  int64_t limit = t + s.s - s.t + 1;
  return limit < s.s ? limit : s.s;
}

}  // namespace loom::kernels::cpu
