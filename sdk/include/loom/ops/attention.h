// Attention: masked softmax and the fused attention op. Part of the op catalogue: loom/ops.h states
// the conventions every op follows (layouts, dtypes, "+=" outputs, the random stream) and includes
// every family.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------

/// "masked_softmax_fwd": P = softmax(scale * S + mask) over the last dimension, where the
/// mask hides key s from query t when causal and s > t + (Sk - T), or when the segment ids
/// of t and s differ (attention_fwd: the keys' own ids when given). A fully masked row gives zeros.
/// (The reference attention core.)
///   inputs:  [0] S float (B, H, T, Sk), [1] segment ids i32 (B, T) or empty (T == Sk)
///   outputs: [0] P float (B, H, T, Sk)
/// "masked_softmax_bwd": dS = scale * P * (dP - sum(dP * P)).
///   inputs:  [0] dP (B, H, T, Sk), [1] P (B, H, T, Sk)    outputs: [0] dS (B, H, T, Sk)
inline constexpr const char* kMaskedSoftmaxFwd = "masked_softmax_fwd";
inline constexpr const char* kMaskedSoftmaxBwd = "masked_softmax_bwd";
struct SoftmaxAttrs {
  float scale;
  int32_t causal;
};

/// "attention_fwd": O = softmax(scale * Q K^T + mask) V per head, query head h reading
/// key/value head h / (H / G); mask as for masked_softmax. Attention dropout acts on the
/// probabilities: element (b, h, t, s) has index i = ((b * H + h) * T + t) * S + s in the
/// Philox convention above, so the mask equals dropout_fwd's on a (B, H, T, S) tensor and
/// the fused core matches the reference core exactly. Fast kernels never materialise
/// (T, S).
///   inputs:  [0] Q float (B, T, H, D), [1] K float (B, S, G, D), [2] V float (B, S, G, D),
///            [3] segment ids i32 (B, T) or empty,
///            [4] (optional; a call may pass 4 inputs) key segment ids i32 (B, S) or empty:
///            with them, [3] holds the queries' segments and [4] the keys', and T may differ
///            from S (a block of a packed sequence's keys, context parallelism); without
///            them the keys' segments are [3]'s, which needs T == S
///   outputs: [0] O float (B, T, H, D), [1] lse f32 (B, H, T): log-sum-exp of each row
/// Q, K and V (and attention_bwd's dQ, dK, dV) may be strided views whose rows are packed
/// (OpArgs::float_rows_in: D has stride 1, B, T and H any non-negative strides), e.g. the
/// parts of one fused QKV projection (loom/cpp/nn/qkv_views.h) read and written in place,
/// with no split or merge copy; dQ, dK and dV must not overlap. O, dO and lse are packed.
/// (Since ABI 1.10. A kernel library built against older headers refuses such views, "not
/// contiguous", as its OpArgs checks did then: rebuild it.)
/// "attention_bwd": the softmax gradient uses the given O and lse as those of each query's
/// whole row (delta = rowsum(dO * O), P = exp(scale * Q K^T - lse)). A call over one block
/// of a longer row's keys (context parallelism) with the row's merged O and lse (see
/// attention_merge) gives that block's share: dK and dV of its keys, and the part of dQ
/// that the block's keys contribute; the shares sum to the whole row's gradients.
///   inputs:  [0] dO (B, T, H, D), [1] Q, [2] K, [3] V, [4] O, [5] lse, [6] segment ids,
///            [7] (optional; a call may pass 7 inputs) key segment ids, as attention_fwd's
///   outputs: [0] dQ (B, T, H, D), [1] dK (B, S, G, D), [2] dV (B, S, G, D)
inline constexpr const char* kAttentionFwd = "attention_fwd";
inline constexpr const char* kAttentionBwd = "attention_bwd";
/// "attention_merge": folds the attention of the same queries over another block of keys
/// into a running result, so that attention over keys split into blocks (context
/// parallelism: one block per rank of the ring) equals attention over all of them:
///   lse' = log(exp(lse) + exp(lse_part)),
///   O    = O * exp(lse - lse') + O_part * exp(lse_part - lse'),   lse = lse'.
/// A row with lse_part = -inf (no visible key in the block) keeps O and lse; a row with
/// lse = -inf (none so far) takes O_part and lse_part.
///   inputs:  [0] O_part float (B, T, H, D), [1] lse_part f32 (B, H, T)
///   outputs: [0] O float (B, T, H, D), read and written; [1] lse f32 (B, H, T), read and
///            written
/// Keyed on the dtype of O.
inline constexpr const char* kAttentionMerge = "attention_merge";
struct AttentionAttrs {
  float scale;  ///< usually 1 / sqrt(D)
  int32_t causal;
  float dropout_p;  ///< 0 outside training
  uint64_t key;     ///< Philox key for the dropout mask
  uint64_t counter;
};

/// The attributes of an attention_fwd / attention_bwd call over one block of a larger
/// attention (context parallelism's (query chunk, key chunk) pairs); a call passes either
/// this or AttentionAttrs, told apart by OpCall::attrs_size. The mask (causal, segments)
/// is the block's own, as with AttentionAttrs; the block's place in the whole decides the
/// dropout mask only: element (b, h, t, s) draws the number of element
/// (b, h, q_offset + t, k_offset + s) of a (B, H, q_total, k_total) tensor, so the blocks
/// of a split sequence draw exactly the whole sequence's mask.
/// Rules: 0 <= q_offset, q_offset + T <= q_total, and the same for k with S.
struct AttentionBlockAttrs {
  AttentionAttrs base;
  int64_t q_offset, k_offset;  ///< the block's first query and key in the whole
  int64_t q_total, k_total;    ///< queries and keys of the whole
};

}  // namespace loom::ops
