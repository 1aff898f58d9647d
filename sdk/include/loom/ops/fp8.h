// FP8 ops (per-tensor scaling): quantisation (alone and fused into swiglu and rope's backward),
// FP8 GEMM and the delayed-scaling update. Part of the op catalogue: loom/ops.h states the
// conventions every op follows (layouts, dtypes, "+=" outputs, the random stream) and includes
// every family.
#pragma once

#include <stdint.h>

namespace loom::ops {

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
///            [2] amax f32 (1), read and written, or empty, [3] (ABI 1.14, optional: a call
///            may pass three outputs) scale_inv f32 (1) or empty: 1 / scale[0], the f32
///            division fp8_scale_update writes its scale_inv with, so the GEMM that reads the
///            codes gets its factor from this kernel and needs no copy of it; written also
///            when X is empty. Not the memory of scale or amax.
/// Y and Yt have one fp8 dtype (e4m3 or e5m2). At least one of Y and Yt is present.
inline constexpr const char* kFp8Quantize = "fp8_quantize";

/// "swiglu_fp8_fwd" / "swiglu_fp8_bwd": swiglu_fwd / swiglu_bwd (loom/ops/elementwise.h)
/// whose result goes straight into FP8, as fp8_quantize would write it, for an FP8 GEMM
/// that consumes it (an MLP's fc2 input in the forward, fc1's output gradient in the
/// backward; Transformer Engine fuses its activations' casts the same way). The result is
/// rounded to X's dtype first, then quantised: Y, Yt and amax are, bit for bit, what
/// swiglu_fwd (or swiglu_bwd) into a tensor of X's dtype followed by fp8_quantize gives on
/// the same kernel library; the intermediate tensor is never written.
///   fwd inputs:  [0] X float (N, 2F) (gate then up), [1] scale f32 (1)
///       outputs: [0] Y fp8 (N, F) or empty, [1] Yt fp8 (F, N) or empty, [2] amax f32 (1),
///                read and written, or empty, [3] (ABI 1.14, optional) scale_inv f32 (1)
///                or empty
///   bwd inputs:  [0] dY (N, F) of X's dtype, [1] X float (N, 2F), [2] scale f32 (1)
///       outputs: [0] dX fp8 (N, 2F) or empty, [1] dXt fp8 (2F, N) or empty, [2] amax f32
///                (1), read and written, or empty, [3] (ABI 1.14, optional) scale_inv
///                f32 (1) or empty
/// As for fp8_quantize: the outputs have one fp8 dtype, at least one of the first two is
/// present, amax is of the values before scaling (NaN propagates), scale_inv = 1 / scale[0].
/// Keyed on X's dtype.
inline constexpr const char* kSwigluFp8Fwd = "swiglu_fp8_fwd";
inline constexpr const char* kSwigluFp8Bwd = "swiglu_fp8_bwd";

/// "rope_fp8_bwd" (ABI 1.16): the backward of a rotary QKV projection's output, quantised for
/// the projection's FP8 GEMMs (its output gradient dY, E5M2 under the usual recipes). dX is
/// the gradient of the QKV projection's output after rope, in Megatron's grouped layout
/// (each of the G groups holds its H/G query heads, then its key head, then its value head:
/// split_qkv's X). The op turns the query and key heads back by rope_bwd's rotation (the
/// value heads pass through), rounds the result to dX's dtype, and quantises it as
/// fp8_quantize would: Y, Yt and amax are, bit for bit, what split_qkv, rope_bwd on the
/// query and key heads, merge_qkv and fp8_quantize give on the same kernel library (a CUDA
/// library's rope_bwd: its typed kernel, which serves every call with X and Y of one dtype
/// and fewer than 2^31 work items). The rotated tensor is never written.
///   inputs:  [0] dX float (B, T, G, (H/G + 2) * D), packed, [1] positions i32 (B, T) or
///            empty (0..T-1), [2] inv_freq f32 (rotary_dim / 2), [3] scale f32 (1)
///   outputs: [0] Y fp8 (B T, G (H/G + 2) D) or empty, [1] Yt fp8 (G (H/G + 2) D, B T) or
///            empty, [2] amax f32 (1), read and written, or empty, [3] scale_inv f32 (1) or
///            empty (as fp8_quantize's)
///   attrs:   RopeFp8Attrs (required)
/// As for fp8_quantize: the outputs have one fp8 dtype, at least one of the first two is
/// present, amax is of the values before scaling (NaN propagates), scale_inv = 1 / scale[0].
/// Keyed on dX's dtype.
inline constexpr const char* kRopeFp8Bwd = "rope_fp8_bwd";
struct RopeFp8Attrs {
  int32_t rotary_dim;  ///< even, <= head_dim (rope_fwd's RopeAttrs::rotary_dim)
  int32_t head_dim;    ///< D: dX's last dimension is (H/G + 2) * D with H/G >= 1
};

/// "fp8_gemm": Y = alpha * (A * a_scale_inv[0]) @ (B * b_scale_inv[0])^T + beta * Y: the
/// one layout cuBLASLt runs FP8 in (both operands K-contiguous; a Linear's forward
/// X @ W^T is it as it stands, its backward GEMMs take the transposes fp8_quantize wrote).
///   inputs:  [0] A fp8 (M, K), [1] B fp8 (N, K), [2] a_scale_inv f32 (1),
///            [3] b_scale_inv f32 (1)
///   outputs: [0] Y float (M, N); read only when beta != 0
///   attrs:   Fp8GemmAttrs (required)
/// A and B may be e4m3 or e5m2 but not both e5m2 (no GPU multiplies two E5M2 operands).
/// Products are exact. The CPU sums in f32 (cpu.ref in f64). A GPU sums in its FP8 tensor
/// cores, which keep about 14 mantissa bits of a partial sum (Hopper) between promotions to
/// f32; so on a device, with fast_accum 0, |Y - exact| <= 2^-10 * |alpha * a_scale_inv *
/// b_scale_inv| * sum_k |A[m, k] * B[n, k]| plus the rounding of Y to its dtype (fast_accum 1
/// promotes rarely or never: errors up to about 2^-6 of that sum). Scales and alpha are
/// applied in f32 to the sum, beta * Y added in f32, then one rounding to Y's dtype.
/// A device kernel declines (`supports` false, kUnimplemented from a call), by design, what
/// cuBLASLt's FP8 GEMMs cannot run: K not a multiple of 16, a row of Y not a multiple of 16
/// bytes (N % 4 for f32 Y, N % 8 for bf16 / f16), A, B or Y not 16-byte aligned, or a GPU
/// older than sm_89; the caller then runs the GEMM in bf16. Keyed on A's dtype.
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

}  // namespace loom::ops
