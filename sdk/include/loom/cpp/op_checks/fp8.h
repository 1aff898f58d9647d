// Argument checks of the FP8 ops of loom/ops.h (fp8_quantize, swiglu_fp8_fwd / _bwd,
// rope_fp8_bwd, fp8_gemm, fp8_scale_update), shared by every kernel library so that the CPU
// and CUDA kernels reject a bad call with the same words (header-only; see loom/cpp/op_args.h).
// Each throws loom::Error(kInvalidArgument) naming the op and the tensor.
//   call:         the call
//   shapes_only:  true inside `supports` (data may be null)
//   device:       the device family of the kernel
#pragma once

#include <string>
#include <vector>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// What an fp8_quantize call does.
struct Fp8QuantizeShape {
  int64_t m, k;      ///< X viewed as (M, K)
  DType out_dtype;   ///< the FP8 dtype of Y / Yt
  bool y, yt, amax;  ///< which outputs are present
  bool scale_inv;    ///< output [3] present (ABI 1.14; a call may pass three outputs)
};

namespace detail {

/// The output names of a quantising op: Y, Yt, amax, and scale_inv when the call passes a
/// fourth output (ABI 1.14). A call with another count is refused by OpArgs, which names the
/// count these give.
inline std::vector<std::string> fp8_output_names(const OpCall* call, const char* y,
                                                 const char* yt) {
  std::vector<std::string> names{y, yt, "amax"};
  if (call != nullptr && call->num_outputs >= 4) names.push_back("scale_inv");
  return names;
}

/// The FP8 outputs of a quantising op writing an (M, K) result, from output 0 on: Y fp8 of
/// `y_like`'s shape when given, else any shape of M rows of K, Yt fp8 (K, M), amax f32 (1),
/// scale_inv f32 (1) when the call has it; each optional, Y or Yt present, one fp8 dtype,
/// scale_inv not the memory of `scale` (nor of amax).
inline Fp8QuantizeShape check_fp8_outputs(const OpArgs& a, const OpCall* call, int64_t m, int64_t k,
                                          const TensorView* y_like, const TensorView& scale) {
  Fp8QuantizeShape s{};
  s.m = m;
  s.k = k;
  s.y = a.has_out(0);
  s.yt = a.has_out(1);
  s.amax = a.has_out(2);
  if (!s.y && !s.yt)
    a.fail(a.out_label(0) + " and " + a.out_label(1) + " are both empty: pass at least one");
  if (s.y) {
    const TensorView& Y = a.fp8_out(0);
    if (y_like != nullptr) {
      bool same = Y.ndim == y_like->ndim;
      for (int32_t d = 0; same && d < Y.ndim; ++d) same = Y.shape[d] == y_like->shape[d];
      if (!same)
        a.fail(a.out_label(0) + " has shape " + view_shape_str(Y) + ", expected X's " +
               view_shape_str(*y_like));
    } else if (Y.ndim < 1 || rows_of(Y) != m || last_dim(Y) != k) {
      a.fail(a.out_label(0) + " has shape " + view_shape_str(Y) +
             ", expected (M, K) with M = " + std::to_string(m) + ", K = " + std::to_string(k));
    }
    s.out_dtype = Y.dtype;
  }
  if (s.yt) {
    const TensorView& Yt = a.fp8_out(1);
    a.shape_out(1, {k, m}, "(K, M), the (M, K) result transposed");
    if (s.y && Yt.dtype != s.out_dtype)
      a.fail(a.out_label(1) + " has dtype " + dtype_name(Yt.dtype) + ", " + a.out_label(0) +
             " has " + dtype_name(s.out_dtype) + ": give both one FP8 dtype");
    s.out_dtype = Yt.dtype;
  }
  if (s.amax) {
    a.f32_out(2);
    a.shape_out(2, {1}, "(1)");
  }
  s.scale_inv = call->num_outputs > 3 && a.has_out(3);
  if (s.scale_inv) {
    const TensorView& si = a.f32_out(3);
    a.shape_out(3, {1}, "(1)");
    if (si.data != nullptr &&
        (si.data == scale.data || (s.amax && si.data == call->outputs[2].data)))
      a.fail(a.out_label(3) + " is the memory of " +
             (si.data == scale.data ? std::string("scale") : a.out_label(2)) +
             ": the kernel reads scale while it writes scale_inv; give it its own (1) tensor");
  }
  return s;
}

}  // namespace detail

/// fp8_quantize: X float (M, K), scale f32 (1); Y fp8 (X's shape), Yt fp8 (K, M), amax f32
/// (1), each optional, Y or Yt present, Y and Yt of one dtype.
inline Fp8QuantizeShape check_fp8_quantize(const OpCall* call, bool shapes_only,
                                           DeviceType device) {
  OpArgs a(call, ops::kFp8Quantize, {"X", "scale"}, detail::fp8_output_names(call, "Y", "Yt"),
           shapes_only, device);
  const TensorView& X = a.float_in(0);
  const TensorView& scale = a.f32_in(1);
  a.shape_in(1, {1}, "(1)");
  return detail::check_fp8_outputs(a, call, rows_of(X), last_dim(X), &X, scale);
}

/// What a swiglu_fp8_fwd / swiglu_fp8_bwd call does: the quantised result's (M, K) is
/// (N, F) forward and (N, 2F) backward.
struct SwigluFp8Shape {
  int64_t n, f;          ///< X viewed as (N, 2F)
  Fp8QuantizeShape out;  ///< the FP8 outputs
};

/// swiglu_fp8_fwd: X float (N, 2F), scale f32 (1); Y fp8 (N, F), Yt fp8 (F, N), amax f32 (1)
/// as fp8_quantize's. swiglu_fp8_bwd (bwd): dY (N, F) of X's dtype first, then X and scale;
/// dX fp8 (N, 2F), dXt (2F, N), amax.
inline SwigluFp8Shape check_swiglu_fp8(const OpCall* call, bool shapes_only, DeviceType device,
                                       bool bwd) {
  OpArgs a = bwd ? OpArgs(call, ops::kSwigluFp8Bwd, {"dY", "X", "scale"},
                          detail::fp8_output_names(call, "dX", "dXt"), shapes_only, device)
                 : OpArgs(call, ops::kSwigluFp8Fwd, {"X", "scale"},
                          detail::fp8_output_names(call, "Y", "Yt"), shapes_only, device);
  const int xi = bwd ? 1 : 0;
  const TensorView& X = a.float_in(xi);
  a.rank_in(xi, 1, "(N, 2F)");
  if (last_dim(X) % 2 != 0)
    a.fail(a.in_label(xi) + " has shape " + view_shape_str(X) +
           ": its last dimension (2F: gate then up projection) must be even");
  a.f32_in(xi + 1);
  a.shape_in(xi + 1, {1}, "(1)");
  SwigluFp8Shape s{rows_of(X), last_dim(X) / 2, {}};
  if (bwd) {
    const TensorView& dY = a.float_in(0);
    if (dY.ndim < 1 || rows_of(dY) != s.n || last_dim(dY) != s.f)
      a.fail(a.in_label(0) + " has shape " + view_shape_str(dY) +
             ", expected (N, F) with N = " + std::to_string(s.n) + ", F = " + std::to_string(s.f));
    if (dY.dtype != X.dtype)
      a.fail(a.in_label(0) + " has dtype " + dtype_name(dY.dtype) + ", expected X's " +
             dtype_name(X.dtype));
  }
  s.out =
      detail::check_fp8_outputs(a, call, s.n, bwd ? 2 * s.f : s.f, nullptr, call->inputs[xi + 1]);
  return s;
}

/// What a rope_fp8_bwd call does: dX (B, T, G, (H/G + 2) D) viewed as the (M, K) =
/// (B T, G (H/G + 2) D) result it quantises.
struct RopeFp8Shape {
  int64_t b, t, g;       ///< dX's first three dimensions
  int64_t heads;         ///< H/G + 2: the heads of a group (queries, then a key, then a value)
  int64_t d, half;       ///< head_dim; rotary_dim / 2 channel pairs rotated in each head
  Fp8QuantizeShape out;  ///< the FP8 outputs, over (B T, G (H/G + 2) D)
};

/// rope_fp8_bwd: dX float (B, T, G, (H/G + 2) D) packed, positions i32 (B, T) or empty,
/// inv_freq f32 (rotary_dim / 2), scale f32 (1); RopeFp8Attrs with head_dim >= 1 dividing dX's
/// last dimension into at least 3 heads, rotary_dim even in [0, head_dim]; outputs as
/// fp8_quantize's over (B T, G (H/G + 2) D).
inline RopeFp8Shape check_rope_fp8_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kRopeFp8Bwd, {"dX", "positions", "inv_freq", "scale"},
           detail::fp8_output_names(call, "Y", "Yt"), shapes_only, device);
  const ops::RopeFp8Attrs& at = a.attrs<ops::RopeFp8Attrs>();
  const TensorView& X = a.float_in(0);
  if (X.ndim != 4)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(X) +
           ", expected (B, T, G, (H/G + 2) * D): the QKV projection's output gradient");
  RopeFp8Shape s{X.shape[0], X.shape[1], X.shape[2], 0, at.head_dim, at.rotary_dim / 2, {}};
  if (at.head_dim < 1 || X.shape[3] % at.head_dim != 0 || X.shape[3] / at.head_dim < 3)
    a.fail("attrs.head_dim = " + std::to_string(at.head_dim) + " does not split " + a.in_label(0) +
           "'s last dimension " + std::to_string(X.shape[3]) +
           " into (H/G + 2) heads of D with H/G >= 1: pass the attention's head dimension");
  s.heads = X.shape[3] / at.head_dim;
  if (at.rotary_dim < 0 || at.rotary_dim % 2 != 0 || at.rotary_dim > at.head_dim)
    a.fail("attrs.rotary_dim = " + std::to_string(at.rotary_dim) +
           " must be even and in [0, head_dim = " + std::to_string(at.head_dim) + "]");
  if (a.opt_i32_in(1)) a.shape_in(1, {s.b, s.t}, "(B, T)");
  a.f32_in(2);
  a.shape_in(2, {s.half}, "(rotary_dim / 2)");
  const TensorView& scale = a.f32_in(3);
  a.shape_in(3, {1}, "(1)");
  s.out = detail::check_fp8_outputs(a, call, s.b * s.t, s.g * X.shape[3], nullptr, scale);
  return s;
}

/// What an fp8_gemm call describes.
struct Fp8GemmShape {
  int64_t m, n, k;
  ops::Fp8GemmAttrs attrs;
};

/// fp8_gemm: A fp8 (M, K), B fp8 (N, K), not both e5m2; scale_invs f32 (1); Y float (M, N).
inline Fp8GemmShape check_fp8_gemm(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kFp8Gemm, {"A", "B", "a_scale_inv", "b_scale_inv"}, {"Y"}, shapes_only,
           device);
  Fp8GemmShape s{};
  s.attrs = a.attrs<ops::Fp8GemmAttrs>();
  const TensorView& A = a.fp8_in(0);
  const TensorView& B = a.fp8_in(1);
  a.f32_in(2);
  a.shape_in(2, {1}, "(1)");
  a.f32_in(3);
  a.shape_in(3, {1}, "(1)");
  a.float_out(0);
  if (A.ndim != 2) a.fail(a.in_label(0) + " has shape " + view_shape_str(A) + ", expected (M, K)");
  if (B.ndim != 2) a.fail(a.in_label(1) + " has shape " + view_shape_str(B) + ", expected (N, K)");
  if (A.dtype == DType::kF8E5M2 && B.dtype == DType::kF8E5M2)
    a.fail(
        "A and B are both fp8_e5m2: at most one operand may be E5M2 (quantise the other "
        "as fp8_e4m3)");
  s.m = A.shape[0];
  s.k = A.shape[1];
  s.n = B.shape[0];
  if (B.shape[1] != s.k)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(B) +
           ", expected (N, K) with K = " + std::to_string(s.k) + " (A is " + view_shape_str(A) +
           "; both operands are K-contiguous: B is stored transposed)");
  a.shape_out(0, {s.m, s.n}, "(M, N)");
  return s;
}

/// What an fp8_scale_update call describes.
struct Fp8ScaleShape {
  int64_t history_len, quantizers;  ///< L, Q
  ops::Fp8ScaleAttrs attrs;
};

/// fp8_scale_update: fp8_max f32 (Q); history f32 (L, Q), scale f32 (Q), scale_inv f32 (Q);
/// algo 0 or 1, current in [0, L), next in [0, L) or -1, margin finite.
inline Fp8ScaleShape check_fp8_scale_update(const OpCall* call, bool shapes_only,
                                            DeviceType device) {
  OpArgs a(call, ops::kFp8ScaleUpdate, {"fp8_max"}, {"history", "scale", "scale_inv"}, shapes_only,
           device);
  Fp8ScaleShape s{};
  s.attrs = a.attrs<ops::Fp8ScaleAttrs>();
  const TensorView& H = a.f32_out(0);
  if (H.ndim != 2) a.fail(a.out_label(0) + " has shape " + view_shape_str(H) + ", expected (L, Q)");
  s.history_len = H.shape[0];
  s.quantizers = H.shape[1];
  a.f32_in(0);
  a.shape_in(0, {s.quantizers}, "(Q)");
  a.f32_out(1);
  a.shape_out(1, {s.quantizers}, "(Q)");
  a.f32_out(2);
  a.shape_out(2, {s.quantizers}, "(Q)");
  if (s.attrs.algo != 0 && s.attrs.algo != 1)
    a.fail("attrs.algo is " + std::to_string(s.attrs.algo) + ": use 0 (max) or 1 (most recent)");
  if (s.history_len < 1) a.fail("the history has no rows: L must be at least 1");
  if (s.attrs.current < 0 || s.attrs.current >= s.history_len)
    a.fail("attrs.current is " + std::to_string(s.attrs.current) + ", outside [0, " +
           std::to_string(s.history_len) + ")");
  if (s.attrs.next < -1 || s.attrs.next >= s.history_len)
    a.fail("attrs.next is " + std::to_string(s.attrs.next) + ": use -1 or a row in [0, " +
           std::to_string(s.history_len) + ")");
  if (!(s.attrs.margin == s.attrs.margin) || s.attrs.margin > 1e30f || s.attrs.margin < -1e30f)
    a.fail("attrs.margin is not finite");
  return s;
}

}  // namespace loom::op_checks
