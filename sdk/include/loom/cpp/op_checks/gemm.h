// Argument checks of "gemm" (loom/ops.h), shared by every kernel library so that the CPU and
// CUDA kernels reject a bad call with the same words (header-only; see loom/cpp/op_args.h).
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/cpp/op_checks/f64.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// The problem a gemm call describes.
struct GemmShape {
  int64_t batch;  ///< product of the batch dimensions (1 without any)
  int64_t m, n, k;
  bool shared_b;  ///< B is 2-D: one matrix for every batch index
  ops::GemmAttrs attrs;
};

/// Checks a gemm call (A (batch..., M, K) or (batch..., K, M), B (K, N) / (N, K) with A's
/// batch dimensions or none, Y (batch..., M, N)) for kernels on `device`: A, B and Y of float
/// dtypes (f32, bf16, f16, mixed as a kernel allows), or all three f64; throws
/// loom::Error(kInvalidArgument) naming the tensor and the expected shape.
/// \param call         the call
/// \param shapes_only  true inside `supports` (data may be null)
/// \param device       the device family of the kernel
inline GemmShape check_gemm(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kGemm, {"A", "B"}, {"Y"}, shapes_only, device);
  GemmShape s{};
  s.attrs = a.attrs<ops::GemmAttrs>();
  const TensorView& A = float_or_f64_in(a, 0);
  const TensorView& B = float_or_f64_in(a, 1);
  const TensorView& Y = float_or_f64_out(a, 0);
  if ((A.dtype == DType::kF64 || B.dtype == DType::kF64 || Y.dtype == DType::kF64) &&
      (A.dtype != DType::kF64 || B.dtype != DType::kF64 || Y.dtype != DType::kF64))
    a.fail(std::string("A, B and Y are ") + dtype_name(A.dtype) + ", " + dtype_name(B.dtype) +
           " and " + dtype_name(Y.dtype) + ": an f64 gemm takes f64 A, B and Y (cast first)");
  a.rank_in(0, 2, s.attrs.trans_a ? "(batch..., K, M)" : "(batch..., M, K)");
  a.rank_in(1, 2, s.attrs.trans_b ? "(N, K) or (batch..., N, K)" : "(K, N) or (batch..., K, N)");
  int32_t nd = A.ndim;
  s.m = A.shape[nd - (s.attrs.trans_a ? 1 : 2)];
  s.k = A.shape[nd - (s.attrs.trans_a ? 2 : 1)];
  s.batch = 1;
  for (int32_t d = 0; d < nd - 2; ++d) s.batch *= A.shape[d];
  s.shared_b = B.ndim == 2;
  int64_t bk = B.shape[B.ndim - (s.attrs.trans_b ? 1 : 2)];
  s.n = B.shape[B.ndim - (s.attrs.trans_b ? 2 : 1)];
  bool b_batch_ok = s.shared_b || B.ndim == nd;
  for (int32_t d = 0; b_batch_ok && !s.shared_b && d < nd - 2; ++d)
    b_batch_ok = B.shape[d] == A.shape[d];
  if (!b_batch_ok)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(B) +
           ": its batch dimensions must equal A's " + view_shape_str(A) + " or be absent (2-D B)");
  if (bk != s.k)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(B) + ", expected " +
           (s.attrs.trans_b ? "(..., N, K)" : "(..., K, N)") + " with K = " + std::to_string(s.k) +
           " (A's inner dimension, A is " + view_shape_str(A) + ")");
  bool y_ok = Y.ndim == nd && Y.shape[nd - 2] == s.m && Y.shape[nd - 1] == s.n;
  for (int32_t d = 0; y_ok && d < nd - 2; ++d) y_ok = Y.shape[d] == A.shape[d];
  if (!y_ok)
    a.fail(a.out_label(0) + " has shape " + view_shape_str(Y) +
           ", expected (batch..., M, N) with M = " + std::to_string(s.m) +
           ", N = " + std::to_string(s.n) + " and A's batch dimensions");
  return s;
}

/// The problem a gemm_epilogue call describes.
struct GemmEpilogueShape {
  int64_t m, n, k;
  ops::GemmEpilogueAttrs attrs;
  bool bias, aux_in, aux_out, dbias;  ///< which optional tensors the call passes
};

/// Checks a gemm_epilogue call (loom/ops.h): A (M, K) / (K, M) and B (K, N) / (N, K) of one
/// float dtype; Y (M, N) in A's dtype (or f32 with kEpilogueBiasGradA); bias (N), the input P
/// and the output aux (M, N) in A's dtype and dbias f32 (N or M) exactly where the epilogue
/// takes them; beta 0 (or 1 with kEpilogueBiasGradA). Throws loom::Error(kInvalidArgument)
/// naming the tensor and what was expected.
/// \param call         the call
/// \param shapes_only  true inside `supports` (data may be null)
/// \param device       the device family of the kernel
inline GemmEpilogueShape check_gemm_epilogue(const OpCall* call, bool shapes_only,
                                             DeviceType device) {
  OpArgs a(call, ops::kGemmEpilogue, {"A", "B", "bias", "P"}, {"Y", "aux", "dbias"}, shapes_only,
           device);
  GemmEpilogueShape s{};
  s.attrs = a.attrs<ops::GemmEpilogueAttrs>();
  const int32_t e = s.attrs.epilogue;
  if (e != ops::kEpilogueBias && e != ops::kEpilogueGelu && e != ops::kEpilogueDGelu &&
      e != ops::kEpilogueBiasGradA)
    a.fail("attrs.epilogue is " + std::to_string(e) +
           ": expected kEpilogueBias (1), kEpilogueGelu (2), kEpilogueDGelu (3) or "
           "kEpilogueBiasGradA (4)");
  if (s.attrs.approximate != 0 && s.attrs.approximate != 1)
    a.fail("attrs.approximate is " + std::to_string(s.attrs.approximate) +
           ": expected 0 (erf) or 1 (tanh)");
  if (!(s.attrs.beta == 0.0f || (e == ops::kEpilogueBiasGradA && s.attrs.beta == 1.0f)))
    a.fail("attrs.beta is " + std::to_string(s.attrs.beta) +
           ": expected 0, or 1 with kEpilogueBiasGradA (accumulate a weight gradient)");
  const TensorView& A = a.float_in(0);
  const TensorView& B = a.float_in(1);
  const TensorView& Y = a.float_out(0);
  if (A.ndim != 2)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(A) + ", expected " +
           (s.attrs.trans_a ? "(K, M)" : "(M, K)"));
  if (B.ndim != 2)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(B) + ", expected " +
           (s.attrs.trans_b ? "(N, K)" : "(K, N)"));
  if (B.dtype != A.dtype)
    a.fail(a.in_label(1) + " has dtype " + dtype_name(B.dtype) + ", expected A's " +
           dtype_name(A.dtype));
  s.m = A.shape[s.attrs.trans_a ? 1 : 0];
  s.k = A.shape[s.attrs.trans_a ? 0 : 1];
  s.n = B.shape[s.attrs.trans_b ? 0 : 1];
  if (B.shape[s.attrs.trans_b ? 1 : 0] != s.k)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(B) + ", expected " +
           (s.attrs.trans_b ? "(N, K)" : "(K, N)") + " with K = " + std::to_string(s.k) +
           " (A is " + view_shape_str(A) + ")");
  a.shape_out(0, {s.m, s.n}, "(M, N)");
  if (Y.dtype != A.dtype && !(e == ops::kEpilogueBiasGradA && Y.dtype == DType::kF32))
    a.fail(a.out_label(0) + " has dtype " + dtype_name(Y.dtype) + ", expected A's " +
           dtype_name(A.dtype) + (e == ops::kEpilogueBiasGradA ? " or f32" : ""));
  s.bias = a.has_in(2);
  s.aux_in = a.has_in(3);
  s.aux_out = a.has_out(1);
  s.dbias = a.has_out(2);
  auto refuse = [&](bool input, int i, const char* which) {
    a.fail((input ? a.in_label(i) : a.out_label(i)) + " must be empty with " + which);
  };
  const char* name = e == ops::kEpilogueBias    ? "kEpilogueBias"
                     : e == ops::kEpilogueGelu  ? "kEpilogueGelu"
                     : e == ops::kEpilogueDGelu ? "kEpilogueDGelu"
                                                : "kEpilogueBiasGradA";
  if (e == ops::kEpilogueBias && !s.bias) a.fail(a.in_label(2) + " is required with kEpilogueBias");
  if (s.bias && e != ops::kEpilogueBias && e != ops::kEpilogueGelu) refuse(true, 2, name);
  if (e == ops::kEpilogueDGelu && !s.aux_in)
    a.fail(a.in_label(3) + " is required with kEpilogueDGelu");
  if (s.aux_in && e != ops::kEpilogueDGelu) refuse(true, 3, name);
  if (s.aux_out && e != ops::kEpilogueGelu) refuse(false, 1, name);
  if (s.dbias && e != ops::kEpilogueDGelu && e != ops::kEpilogueBiasGradA) refuse(false, 2, name);
  auto same_dtype = [&](const TensorView& v, const std::string& label) {
    if (v.dtype != A.dtype)
      a.fail(label + " has dtype " + dtype_name(v.dtype) + ", expected A's " + dtype_name(A.dtype));
  };
  if (s.bias) {
    same_dtype(a.float_in(2), a.in_label(2));
    a.shape_in(2, {s.n}, "(N)");
  }
  if (s.aux_in) {
    same_dtype(a.float_in(3), a.in_label(3));
    a.shape_in(3, {s.m, s.n}, "(M, N)");
  }
  if (s.aux_out) {
    same_dtype(a.float_out(1), a.out_label(1));
    a.shape_out(1, {s.m, s.n}, "(M, N)");
  }
  if (s.dbias) {
    a.f32_out(2);
    if (e == ops::kEpilogueDGelu)
      a.shape_out(2, {s.n}, "(N)");
    else
      a.shape_out(2, {s.m}, "(M)");
  }
  return s;
}

}  // namespace loom::op_checks
