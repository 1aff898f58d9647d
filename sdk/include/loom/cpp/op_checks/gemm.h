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

}  // namespace loom::op_checks
