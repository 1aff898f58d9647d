// The op catalogue: name, version, inputs, outputs and attributes of every op that modules
// call through IHost::find_kernel (loom/kernel.h). Kernel libraries (kernels/cpu,
// kernels/cuda, third-party) implement these contracts; the CPU reference implementation
// of each op is the oracle the others are tested against.
//
// Conventions for every op below, unless its entry says otherwise:
// - All tensors are contiguous, row-major (TensorView::strides are those of a packed
//   tensor). An optional input is passed as a view with data == null.
// - "float" means a storage dtype of f32, bf16 or f16. Kernels convert on load and store
//   and compute in f32; the dtype a kernel is keyed on (KernelDesc::dtype) is that of
//   input [0] unless stated.
// - Outputs named "+=" are accumulated into (parameter gradients, always f32); all other
//   outputs are overwritten.
// - N is a number of rows (tokens, B*T), C a row width (hidden size), V the vocabulary,
//   B batch, T query length, S key length, H query heads, G key/value heads, D head dim.
// - Random numbers (dropout) come from a counter-based Philox4x32-10 stream: element i of a
//   call uses the 4-word block at (key, counter + i / 4), word i % 4, and keeps the element
//   when (word >> 8) * 2^-24 >= p. Every device draws the same mask for the same key.
#pragma once

#include <stdint.h>

namespace loom::ops {

/// Version of the contracts below (KernelDesc::op_version).
inline constexpr int32_t kVersion = 1;

// ---------------------------------------------------------------------------------------
// Linear algebra
// ---------------------------------------------------------------------------------------

/// "gemm": Y[b] = alpha * op(A[b]) @ op(B[b]) + beta * Y[b], for every batch index b.
///   inputs:  [0] A float (batch..., M, K), or (batch..., K, M) when trans_a
///            [1] B float (batch..., K, N), or (batch..., N, K) when trans_b; B may also
///                have no batch dimensions (2-D), and is then shared by every batch
///   outputs: [0] Y float (batch..., M, N); read only when beta != 0
/// Y's dtype may differ from A's and B's (weight gradients accumulate into f32).
inline constexpr const char* kGemm = "gemm";
struct GemmAttrs {
  int32_t trans_a;  ///< 1: A is stored transposed
  int32_t trans_b;  ///< 1: B is stored transposed (a Linear's weight (out, in) is)
  float alpha;
  float beta;  ///< 0 overwrites Y, 1 accumulates into it
};

// ---------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------

/// "add": Y = A + B (same shape, any float dtypes). Y may alias A or B.
///   inputs: [0] A, [1] B   outputs: [0] Y
inline constexpr const char* kAdd = "add";

/// "bias_add": Y[n, c] += bias[c] in place.
///   inputs: [0] bias float (C)   outputs: [0] Y float (N, C), read and written
/// Keyed on the dtype of Y.
inline constexpr const char* kBiasAdd = "bias_add";

/// "bias_grad": dbias[c] += sum_n dY[n, c].
///   inputs: [0] dY float (N, C)   outputs: [0] dbias f32 (C) +=
inline constexpr const char* kBiasGrad = "bias_grad";

/// "cast": Y = X converted to Y's dtype (float dtypes, round to nearest even).
///   inputs: [0] X   outputs: [0] Y (same shape)
inline constexpr const char* kCast = "cast";

/// "scale": Y = alpha * X (Y may alias X).
///   inputs: [0] X float   outputs: [0] Y float
inline constexpr const char* kScale = "scale";
struct ScaleAttrs {
  float alpha;
};

/// "sumsq": out[0] += sum of X^2 in f64 (non-finite inputs give a non-finite result).
///   inputs: [0] X float (any shape)   outputs: [0] out f64 (1) +=
inline constexpr const char* kSumSq = "sumsq";

/// "amax": out[0] = max(out[0], max |X|) in f32, for FP8 scaling recipes (amax history)
/// and overflow checks. NaN propagates: a NaN in X or in out[0] gives NaN. Start from
/// out[0] = 0 for the amax of X alone; an empty X leaves out[0] unchanged.
///   inputs: [0] X float (any shape)   outputs: [0] out f32 (1), read and written
inline constexpr const char* kAmax = "amax";

/// "gelu_fwd" / "gelu_bwd": Y = gelu(X), exact (erf) or tanh approximation.
///   fwd inputs: [0] X float (N)            outputs: [0] Y float (N)
///   bwd inputs: [0] dY (N), [1] X (N)      outputs: [0] dX (N)
inline constexpr const char* kGeluFwd = "gelu_fwd";
inline constexpr const char* kGeluBwd = "gelu_bwd";
struct GeluAttrs {
  int32_t approximate;  ///< 0: x * Phi(x) (erf); 1: tanh approximation (GPT-2)
};

/// "swiglu_fwd" / "swiglu_bwd": Y = silu(X[:, :F]) * X[:, F:] (Megatron's fused layout:
/// the gate is the first half of the fc1 output, the up projection the second).
///   fwd inputs: [0] X float (N, 2F)                outputs: [0] Y float (N, F)
///   bwd inputs: [0] dY (N, F), [1] X (N, 2F)       outputs: [0] dX (N, 2F)
inline constexpr const char* kSwigluFwd = "swiglu_fwd";
inline constexpr const char* kSwigluBwd = "swiglu_bwd";

/// "dropout_fwd" / "dropout_bwd": Y = X * keep / (1 - p), the mask drawn from (key,
/// counter) as described above, so backward redraws it instead of storing it.
///   fwd inputs: [0] X float   outputs: [0] Y float   (Y may alias X)
///   bwd inputs: [0] dY        outputs: [0] dX
inline constexpr const char* kDropoutFwd = "dropout_fwd";
inline constexpr const char* kDropoutBwd = "dropout_bwd";
struct DropoutAttrs {
  float p;  ///< drop probability in [0, 1)
  uint64_t key;
  uint64_t counter;
};

// ---------------------------------------------------------------------------------------
// FP8 (per-tensor scaling; the recipe that picks the scales is an fp8_recipe component)
// ---------------------------------------------------------------------------------------
// Conversions to FP8 (OCP E4M3 "fn", max 448; E5M2, max 57344) round to nearest even and
// saturate: a finite or infinite value beyond the format's largest magnitude becomes that
// magnitude with its sign; NaN stays NaN (loom/cpp/fp8.h has the host conversions).

/// "fp8_quantize": Y = fp8(X * scale[0]) and, for the GEMMs of backward, its transpose;
/// amax[0] = max(amax[0], max |X|) (of X, before scaling; NaN propagates as in "amax").
///   inputs:  [0] X float (M, K) (leading dimensions flatten into M), [1] scale f32 (1)
///   outputs: [0] Y fp8 (X's shape) or empty, [1] Yt fp8 (K, M) = Y transposed, or empty,
///            [2] amax f32 (1), read and written, or empty
/// Y and Yt have one fp8 dtype (e4m3 or e5m2). At least one of Y and Yt is present.
inline constexpr const char* kFp8Quantize = "fp8_quantize";

/// "fp8_gemm": Y = alpha * (A * a_scale_inv[0]) @ (B * b_scale_inv[0])^T + beta * Y: the
/// one layout cuBLASLt runs FP8 in (both operands K-contiguous; a Linear's forward
/// X @ W^T is it as it stands, its backward GEMMs take the transposes fp8_quantize wrote).
///   inputs:  [0] A fp8 (M, K), [1] B fp8 (N, K), [2] a_scale_inv f32 (1),
///            [3] b_scale_inv f32 (1)
///   outputs: [0] Y float (M, N); read only when beta != 0
///   attrs:   Fp8GemmAttrs (required)
/// A and B may be e4m3 or e5m2 but not both e5m2 (no GPU multiplies two E5M2 operands).
/// Products are exact and sums are in f32 (with fast_accum, a GPU may sum in its FP8 tensor
/// cores' reduced precision). Keyed on A's dtype.
inline constexpr const char* kFp8Gemm = "fp8_gemm";
struct Fp8GemmAttrs {
  float alpha;
  float beta;          ///< 0 overwrites Y, 1 accumulates into it (weight gradients)
  int32_t fast_accum;  ///< 1: allow the tensor cores' fast accumulation (forward GEMMs)
};

/// "fp8_scale_update": delayed scaling (Transformer Engine's recipe) for Q quantisers at
/// once, each a column of an amax history of L rows (one row per step, a ring):
///   amax_q  = max over the L rows of column q (algo 0), or history[current, q] (algo 1)
///   scale_q = fp8_max[q] / amax_q / 2^margin when amax_q is finite and > 0 (FLT_MAX if
///             that overflows to infinity), else scale_q is left as it was
///   scale_inv_q = 1 / scale_q
/// and then row `next` of the history is zeroed, to collect the coming step's amaxes
/// (next < 0: no row is zeroed).
///   inputs:  [0] fp8_max f32 (Q): 448 for an E4M3 quantiser, 57344 for an E5M2 one
///   outputs: [0] history f32 (L, Q), read and written; [1] scale f32 (Q), read and
///            written; [2] scale_inv f32 (Q)
///   attrs:   Fp8ScaleAttrs (required)
/// Keyed on f32.
inline constexpr const char* kFp8ScaleUpdate = "fp8_scale_update";
struct Fp8ScaleAttrs {
  int32_t algo;     ///< 0: max over the history, 1: the most recent amax
  int32_t current;  ///< the history row of the newest amaxes, in [0, L)
  int32_t next;     ///< the row to zero afterwards, in [0, L), or -1
  float margin;     ///< scale down by 2^margin (headroom)
};

// ---------------------------------------------------------------------------------------
// Embedding, norms, rotary
// ---------------------------------------------------------------------------------------

/// "embedding_fwd": Y[n] = table[ids[n]]. Ids outside [0, V) are an error (kOutOfRange).
///   inputs: [0] table float (V, C), [1] ids i32 (N)   outputs: [0] Y float (N, C)
/// "embedding_bwd": dtable[ids[n]] += dY[n].
///   inputs: [0] dY float (N, C), [1] ids i32 (N)      outputs: [0] dtable f32 (V, C) +=
/// Both take optional attrs (null: the whole vocabulary). With EmbeddingAttrs the table is
/// the rows [vocab_start, vocab_start + V) of a vocabulary of vocab_size rows split over
/// tensor-parallel ranks: an id in that range uses row id - vocab_start; any other id in
/// [0, vocab_size) gives a zero row (forward) and adds nothing (backward); ids outside
/// [0, vocab_size) are an error (kOutOfRange).
inline constexpr const char* kEmbeddingFwd = "embedding_fwd";
inline constexpr const char* kEmbeddingBwd = "embedding_bwd";
struct EmbeddingAttrs {
  int64_t vocab_start;  ///< first vocabulary row held by this table
  int64_t vocab_size;   ///< rows of the whole (unsplit) vocabulary
};

/// "layernorm_fwd": Y = (X - mean) * rstd * weight + bias over the last dimension.
///   inputs:  [0] X float (N, C), [1] weight float (C), [2] bias float (C) or empty
///   outputs: [0] Y float (N, C), [1] mean f32 (N), [2] rstd f32 (N)
/// "layernorm_bwd":
///   inputs:  [0] dY (N, C), [1] X (N, C), [2] weight (C), [3] mean (N), [4] rstd (N)
///   outputs: [0] dX (N, C), [1] dweight f32 (C) +=, [2] dbias f32 (C) += or empty
inline constexpr const char* kLayerNormFwd = "layernorm_fwd";
inline constexpr const char* kLayerNormBwd = "layernorm_bwd";
struct NormAttrs {
  float eps;
  int32_t zero_centered_gamma;  ///< 1: the weight is stored as (gamma - 1) (Megatron option)
};

/// "rmsnorm_fwd": Y = X * rstd * weight, rstd = 1 / sqrt(mean(X^2) + eps).
///   inputs:  [0] X float (N, C), [1] weight float (C)
///   outputs: [0] Y float (N, C), [1] rstd f32 (N)
/// "rmsnorm_bwd":
///   inputs:  [0] dY (N, C), [1] X (N, C), [2] weight (C), [3] rstd (N)
///   outputs: [0] dX (N, C), [1] dweight f32 (C) +=
/// Attributes: NormAttrs.
inline constexpr const char* kRmsNormFwd = "rmsnorm_fwd";
inline constexpr const char* kRmsNormBwd = "rmsnorm_bwd";

/// "rope_fwd": rotates the first `rotary_dim` channels of each head by the angle
/// position * inv_freq[i] (GPT-NeoX / Llama layout: channel i pairs with i + rotary_dim/2);
/// the other channels pass through. "rope_bwd" applies the inverse rotation (the
/// gradient of a rotation is its transpose).
///   inputs:  [0] X float (B, T, H, D), [1] positions i32 (B, T) or empty (0..T-1),
///            [2] inv_freq f32 (rotary_dim / 2): already scaled (linear, Llama 3, ...)
///   outputs: [0] Y float (B, T, H, D); may alias X
inline constexpr const char* kRopeFwd = "rope_fwd";
inline constexpr const char* kRopeBwd = "rope_bwd";
struct RopeAttrs {
  int32_t rotary_dim;  ///< even, <= D
};

/// "swap_axes_12": Y[a, j, i, d] = X[a, i, j, d], e.g. (B, T, H, D) <-> (B, H, T, D), for
/// attention cores that work head-major. Any dtype of 2 or 4 bytes.
///   inputs: [0] X (A, I, J, D)   outputs: [0] Y (A, J, I, D)
inline constexpr const char* kSwapAxes12 = "swap_axes_12";

/// "split_qkv": splits the fused QKV projection in Megatron's grouped layout, where each
/// of the G groups holds its H/G query heads, then its key head, then its value head.
///   inputs:  [0] X float (B, T, G, (H/G + 2) * D)
///   outputs: [0] Q (B, T, H, D), [1] K (B, T, G, D), [2] V (B, T, G, D)
/// "merge_qkv": the inverse (the backward of split_qkv).
///   inputs:  [0] dQ (B, T, H, D), [1] dK (B, T, G, D), [2] dV (B, T, G, D)
///   outputs: [0] dX (B, T, G, (H/G + 2) * D)
inline constexpr const char* kSplitQkv = "split_qkv";
inline constexpr const char* kMergeQkv = "merge_qkv";

// ---------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------

/// "masked_softmax_fwd": P = softmax(scale * S + mask) over the last dimension, where the
/// mask hides key s from query t when causal and s > t + (Sk - T), or when the segment ids
/// of t and s differ. A fully masked row gives zeros. (The reference attention core.)
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
///            [3] segment ids i32 (B, T) or empty
///   outputs: [0] O float (B, T, H, D), [1] lse f32 (B, H, T): log-sum-exp of each row
/// "attention_bwd":
///   inputs:  [0] dO (B, T, H, D), [1] Q, [2] K, [3] V, [4] O, [5] lse, [6] segment ids
///   outputs: [0] dQ (B, T, H, D), [1] dK (B, S, G, D), [2] dV (B, S, G, D)
inline constexpr const char* kAttentionFwd = "attention_fwd";
inline constexpr const char* kAttentionBwd = "attention_bwd";
struct AttentionAttrs {
  float scale;  ///< usually 1 / sqrt(D)
  int32_t causal;
  float dropout_p;  ///< 0 outside training
  uint64_t key;     ///< Philox key for the dropout mask
  uint64_t counter;
};

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
inline constexpr const char* kCrossEntropyFwd = "cross_entropy_fwd";
inline constexpr const char* kCrossEntropyBwd = "cross_entropy_bwd";
struct CrossEntropyShardAttrs {
  int64_t vocab_start;  ///< first vocabulary column held by this shard of the logits
  int64_t vocab_size;   ///< columns of the whole vocabulary
};

/// Vocab-parallel cross entropy (Megatron's), in two steps around an all-gather over the
/// tensor-parallel group, so that no rank ever holds the whole (N, V) logits:
/// "cross_entropy_shard_stats": per row of this rank's shard of the logits, the statistics
/// that combine into the loss: stats[n] = (m, s, t) with m = max_j logits[n, j],
/// s = sum_j exp(logits[n, j] - m), and t = logits[n, labels[n] - vocab_start] when the
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

// ---------------------------------------------------------------------------------------
// Optimizer steps (on contiguous f32 shards)
// ---------------------------------------------------------------------------------------

/// "adamw_step": g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// w -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w).
///   inputs:  [0] grad float (n)
///   outputs: [0] master f32 (n), [1] exp_avg f32 (n), [2] exp_avg_sq f32 (n), all read and
///            written; [3] param float (n) or empty: receives the new master, cast
/// Keyed on the dtype of grad.
inline constexpr const char* kAdamWStep = "adamw_step";
struct AdamWAttrs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;  ///< 0 for parameters without decay
  float grad_scale;
  int64_t step;  ///< 1-based, for bias correction
};

/// "adamw_step_multi": adamw_step over K shards in one call, the multi-tensor optimizer step
/// (apex / PyTorch's foreach AdamW): a GPU library launches one kernel per table of shards
/// instead of two (update and cast) per parameter tensor. Shard i is exactly adamw_step
/// with weight decay weight_decay[i]: its results are bit-identical to K adamw_step calls
/// of the same kernel library.
///   inputs:  [i] grad_i float (n_i), i in [0, K); every grad of one dtype (the op is keyed
///            on it: shards with f32 and bf16 gradients take one call per dtype)
///   outputs: 4K views, for shard i: [4i] master_i f32 (n_i), [4i+1] exp_avg_i f32 (n_i),
///            [4i+2] exp_avg_sq_i f32 (n_i), all read and written; [4i+3] param_i float
///            (n_i) or empty: receives the new master, cast (adamw_step's output [3])
///   attrs:   AdamWMultiAttrs (required)
/// K >= 1; n_i may be 0. Shards must not overlap one another (they run in any order, in
/// parallel); params may differ in dtype.
inline constexpr const char* kAdamWStepMulti = "adamw_step_multi";
struct AdamWMultiAttrs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float grad_scale;
  int32_t count;  ///< K, the number of shards: must equal the call's num_inputs
  int64_t step;   ///< 1-based, for bias correction
  /// [count] floats in host memory (whatever device the tensors are on): shard i's weight
  /// decay, 0 for parameters without decay. Read during the call only.
  const float* weight_decay;
};

/// "sgd_step": g = grad * grad_scale + weight_decay * w; buf = momentum * buf + g (buf = g
/// at step 1); w -= lr * (nesterov ? g + momentum * buf : buf).
///   inputs:  [0] grad float (n)
///   outputs: [0] master f32 (n), [1] momentum buffer f32 (n) (empty when momentum == 0),
///            [2] param float (n) or empty
inline constexpr const char* kSgdStep = "sgd_step";
struct SgdAttrs {
  float lr;
  float momentum;
  float weight_decay;
  float grad_scale;
  int32_t nesterov;
  int64_t step;
};

}  // namespace loom::ops
