// Loss: cross entropy, whole and vocab-parallel, and the masked sums that combine a loss. Part of
// the op catalogue: loom/ops.h states the conventions every op follows (layouts, dtypes, "+="
// outputs, the random stream) and includes every family.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Loss
// ---------------------------------------------------------------------------------------

/// "cross_entropy_fwd": loss[n] = logsumexp(logits[n]) - logits[n, labels[n]], without
/// materialising probabilities, and the masked mean sum_n mask[n] loss[n] / sum_n mask[n]
/// (0 when the mask is all zero). Labels outside [0, V) are an error (kOutOfRange) unless
/// their mask is 0 (such rows get loss 0).
///   inputs:  [0] logits float (N, V), [1] labels i32 (N), [2] mask f32 (N) or empty (all 1)
///   outputs: [0] loss f32 (N), [1] lse f32 (N), [2] mean f32 (1)
/// "cross_entropy_bwd": dlogits[n] = dmean * mask[n] / sum(mask) * (softmax(logits[n]) -
/// onehot(labels[n])); dmean is read from device memory (no host round trip).
///   inputs:  [0] logits (N, V), [1] labels (N), [2] mask (N) or empty, [3] lse (N),
///            [4] dmean f32 (1)
///   outputs: [0] dlogits float (N, V)
/// cross_entropy_bwd takes optional CrossEntropyShardAttrs (null: logits hold the whole
/// vocabulary): logits are then the columns [vocab_start, vocab_start + V) of a vocabulary
/// of vocab_size, lse is the logsumexp over the whole vocabulary (cross_entropy_combine),
/// labels are validated against [0, vocab_size), and the onehot term applies only to a
/// label inside this shard (column labels[n] - vocab_start).
/// Padding (a vocabulary padded to a multiple of make_vocab_size_divisible_by x tp, as in
/// Megatron, so that the output layer's GEMMs get aligned shapes): logits columns whose
/// vocabulary column vocab_start + j is at or beyond vocab_size are padding. They take no
/// part in the max, the sum of exponentials, the label or the loss, so the results equal
/// those of the unpadded logits, and their gradient is exactly 0 (unlike Megatron, which
/// keeps them in the softmax). cross_entropy_fwd takes optional attrs for this alone
/// (vocab_start 0, vocab_size <= V); a shard may be padding whole (vocab_start >=
/// vocab_size: stats (-inf, 0, 0), gradient 0).
inline constexpr const char* kCrossEntropyFwd = "cross_entropy_fwd";
inline constexpr const char* kCrossEntropyBwd = "cross_entropy_bwd";
/// "cross_entropy_fwd_bwd" (ABI 1.12): cross_entropy_fwd and cross_entropy_bwd in one pass
/// over the logits, for a caller that knows the loss's gradient dmean before the forward
/// (IForwardContext::loss_grad): outputs [0..2] are cross_entropy_fwd's, and dlogits is
/// exactly what cross_entropy_bwd of the same kernel library gives from those logits, that
/// lse and dmean. dlogits may be the logits themselves (in place: the logits' memory holds
/// their gradient afterwards, as Megatron's fused cross entropy does), which saves the
/// (N, V) buffer of the gradient; it must otherwise not overlap any input. A library may
/// leave the op out: the caller then runs the two ops.
///   inputs:  [0] logits float (N, V), [1] labels i32 (N), [2] mask f32 (N) or empty,
///            [3] dmean f32 (1) (device memory, read when the kernel runs)
///   outputs: [0] loss f32 (N), [1] lse f32 (N), [2] mean f32 (1), [3] dlogits float (N, V)
///   attrs:   optional CrossEntropyShardAttrs, as cross_entropy_fwd's (padding only)
/// Keyed on the dtype of input [0].
inline constexpr const char* kCrossEntropyFwdBwd = "cross_entropy_fwd_bwd";
struct CrossEntropyShardAttrs {
  int64_t vocab_start;  ///< first vocabulary column held by this shard of the logits
  int64_t vocab_size;   ///< columns of the whole vocabulary
};

/// Vocab-parallel cross entropy (Megatron's), in two steps around an all-gather over the
/// tensor-parallel group, so that no rank ever holds the whole (N, V) logits:
/// "cross_entropy_shard_stats": per row of this rank's shard of the logits, the statistics
/// that combine into the loss: stats[n] = (m, s, t) with m = max_j logits[n, j],
/// s = sum_j exp(logits[n, j] - m) over the shard's vocabulary columns (not its padding, see
/// above; none: m = -inf, s = 0), and t = logits[n, labels[n] - vocab_start] when the
/// label falls in [vocab_start, vocab_start + V), else 0. Labels outside [0, vocab_size)
/// are an error (kOutOfRange) unless their mask is 0 (such rows get t = 0).
///   inputs:  [0] logits float (N, V) (this shard), [1] labels i32 (N),
///            [2] mask f32 (N) or empty (all 1)
///   outputs: [0] stats f32 (N, 3)
///   attrs:   CrossEntropyShardAttrs (required)
/// "cross_entropy_combine": from the stats of all P shards (in any order), the whole
/// vocabulary's results, exactly those of cross_entropy_fwd:
/// M = max_p m_p, lse[n] = M + log(sum_p s_p exp(m_p - M)), loss[n] = lse[n] - sum_p t_p
/// (0 where the mask is 0 and the label is outside the vocabulary), and the masked mean.
///   inputs:  [0] stats f32 (P, N, 3), [1] labels i32 (N), [2] mask f32 (N) or empty
///   outputs: [0] loss f32 (N), [1] lse f32 (N), [2] mean f32 (1)
///   attrs:   CrossEntropyShardAttrs (vocab_size is used; vocab_start is ignored)
/// Both are keyed on the dtype of input [0] (combine: f32).
inline constexpr const char* kCrossEntropyShardStats = "cross_entropy_shard_stats";
inline constexpr const char* kCrossEntropyCombine = "cross_entropy_combine";

/// "masked_sum": the two sums from which pipeline stages and context-parallel ranks combine
/// a masked mean exactly: out = [sum_n mask[n] x[n], sum_n mask[n]], accumulated in f64 and
/// stored f32 ([sum_n x[n], N] without a mask). A model reports its loss as (sum, tokens)
/// with it (loom/kinds/model.h).
///   inputs:  [0] x f32 (N), [1] mask f32 (N) or empty (all 1)
///   outputs: [0] out f32 (2)
/// Keyed on f32.
inline constexpr const char* kMaskedSum = "masked_sum";

}  // namespace loom::ops
