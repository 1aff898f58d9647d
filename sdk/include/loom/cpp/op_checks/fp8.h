// Argument checks of the FP8 ops of loom/ops.h (fp8_quantize, fp8_gemm, fp8_scale_update),
// shared by every kernel library so that the CPU and CUDA kernels reject a bad call with the
// same words (header-only; see loom/cpp/op_args.h). Each throws loom::Error(kInvalidArgument)
// naming the op and the tensor.
//   call:         the call
//   shapes_only:  true inside `supports` (data may be null)
//   device:       the device family of the kernel
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// What an fp8_quantize call does.
struct Fp8QuantizeShape {
  int64_t m, k;      ///< X viewed as (M, K)
  DType out_dtype;   ///< the FP8 dtype of Y / Yt
  bool y, yt, amax;  ///< which outputs are present
};

/// fp8_quantize: X float (M, K), scale f32 (1); Y fp8 (X's shape), Yt fp8 (K, M), amax f32
/// (1), each optional, Y or Yt present, Y and Yt of one dtype.
inline Fp8QuantizeShape check_fp8_quantize(const OpCall* call, bool shapes_only,
                                           DeviceType device) {
  OpArgs a(call, ops::kFp8Quantize, {"X", "scale"}, {"Y", "Yt", "amax"}, shapes_only, device);
  const TensorView& X = a.float_in(0);
  a.f32_in(1);
  a.shape_in(1, {1}, "(1)");
  Fp8QuantizeShape s{};
  s.m = rows_of(X);
  s.k = last_dim(X);
  s.y = a.has_out(0);
  s.yt = a.has_out(1);
  s.amax = a.has_out(2);
  if (!s.y && !s.yt) a.fail("output 0 (Y) and output 1 (Yt) are both empty: pass at least one");
  if (s.y) {
    const TensorView& Y = a.fp8_out(0);
    bool same = Y.ndim == X.ndim;
    for (int32_t d = 0; same && d < X.ndim; ++d) same = Y.shape[d] == X.shape[d];
    if (!same)
      a.fail(a.out_label(0) + " has shape " + view_shape_str(Y) + ", expected X's " +
             view_shape_str(X));
    s.out_dtype = Y.dtype;
  }
  if (s.yt) {
    const TensorView& Yt = a.fp8_out(1);
    a.shape_out(1, {s.k, s.m}, "(K, M), X's (M, K) transposed");
    if (s.y && Yt.dtype != s.out_dtype)
      a.fail(a.out_label(1) + " has dtype " + dtype_name(Yt.dtype) + ", Y has " +
             dtype_name(s.out_dtype) + ": give both one FP8 dtype");
    s.out_dtype = Yt.dtype;
  }
  if (s.amax) {
    a.f32_out(2);
    a.shape_out(2, {1}, "(1)");
  }
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
