// Embedding, norms, rotary embeddings and the layout ops of attention (swap_axes_12, split_qkv,
// merge_qkv). Part of the op catalogue: loom/ops.h states the conventions every op follows
// (layouts, dtypes, "+=" outputs, the random stream) and includes every family.
#pragma once

#include <stdint.h>

namespace loom::ops {

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
/// [0, vocab_size) are an error (kOutOfRange). Table rows at or beyond vocabulary row
/// vocab_size are padding (a padded vocabulary, ParamInfo::valid_rows): no id reaches them,
/// and a table may be padding whole (vocab_start >= vocab_size).
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
///   dX aliases neither dY nor X (a kernel may read them again after writing dX).
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
///   dX aliases neither dY nor X.
/// Attributes: NormAttrs.
inline constexpr const char* kRmsNormFwd = "rmsnorm_fwd";
inline constexpr const char* kRmsNormBwd = "rmsnorm_bwd";

/// A residual add fused into the norm after it (a pre-norm layer's residual stream: the sum
/// that is both the next residual and the norm's input).
/// "add_layernorm_fwd": Z = X + R, rounded to Z's dtype; Y = layernorm(Z) exactly as
/// layernorm_fwd of that Z (mean and rstd are Z's).
///   inputs:  [0] X float (N, C), [1] R float (N, C), [2] weight float (C),
///            [3] bias float (C) or empty
///   outputs: [0] Y float (N, C), [1] Z float (N, C), [2] mean f32 (N), [3] rstd f32 (N)
///   Z may alias X or R (an in-place residual); X, R, Y and Z share one dtype.
/// "add_layernorm_bwd": layernorm_bwd of Z plus dZ, the gradient that reaches Z by the other
/// path (the residual stream): dX = layernorm_bwd(dY, Z, ...) + dZ, which is the gradient of
/// both X and R. Also the backward of a plain layernorm whose input has a second consumer
/// (Z = that input, dZ = the other consumer's gradient).
///   inputs:  [0] dY (N, C), [1] Z (N, C), [2] weight (C), [3] mean f32 (N), [4] rstd f32 (N),
///            [5] dZ (N, C)
///   outputs: [0] dX (N, C), [1] dweight f32 (C) +=, [2] dbias f32 (C) += or empty
///   dY, Z, dZ and dX share one dtype; dX aliases no input. A kernel may round the norm's
///   gradient to the dtype before adding dZ (what the unfused ops do) or add in f32 and
///   round once.
/// "add_rmsnorm_fwd" / "add_rmsnorm_bwd": the same around rmsnorm (no mean, no bias).
///   fwd inputs:  [0] X, [1] R, [2] weight        outputs: [0] Y, [1] Z, [2] rstd f32 (N)
///   bwd inputs:  [0] dY, [1] Z, [2] weight, [3] rstd f32 (N), [4] dZ
///   bwd outputs: [0] dX, [1] dweight f32 (C) +=
/// Attributes: NormAttrs.
inline constexpr const char* kAddLayerNormFwd = "add_layernorm_fwd";
inline constexpr const char* kAddLayerNormBwd = "add_layernorm_bwd";
inline constexpr const char* kAddRmsNormFwd = "add_rmsnorm_fwd";
inline constexpr const char* kAddRmsNormBwd = "add_rmsnorm_bwd";

/// "rope_fwd": rotates the first `rotary_dim` channels of each head by the angle
/// position * inv_freq[i] (GPT-NeoX / Llama layout: channel i pairs with i + rotary_dim/2);
/// the other channels pass through. "rope_bwd" applies the inverse rotation (the
/// gradient of a rotation is its transpose).
///   inputs:  [0] X float (B, T, H, D), [1] positions i32 (B, T) or empty (0..T-1),
///            [2] inv_freq f32 (rotary_dim / 2): already scaled (linear, Llama 3, ...)
///   outputs: [0] Y float (B, T, H, D); may alias X
/// X and Y may be views with strided rows (OpArgs::float_rows_in), e.g. q and k as views of
/// a fused QKV projection rotated in place (since ABI 1.10).
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

}  // namespace loom::ops
