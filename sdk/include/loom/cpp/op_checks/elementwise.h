// Argument checks of the elementwise ops of loom/ops.h (add, bias_add, bias_grad, cast,
// scale, sumsq, amax), shared by every kernel library so that the CPU and CUDA kernels
// reject a bad call with the same words (header-only; see loom/cpp/op_args.h). Each returns
// what the kernel needs to know of the shapes, and throws loom::Error(kInvalidArgument)
// naming the op and the tensor otherwise.
//   call:         the call
//   shapes_only:  true inside `supports` (data may be null)
//   device:       the device family of the kernel
#pragma once

#include "loom/cpp/op_args.h"
#include "loom/cpp/op_checks/f64.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// add: A, B, Y float (any mix of f32, bf16, f16) or all three f64, with the same number of
/// elements; returns that number.
inline int64_t check_add(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kAdd, {"A", "B"}, {"Y"}, shapes_only, device);
  const TensorView& A = float_or_f64_in(a, 0);
  const TensorView& B = float_or_f64_in(a, 1);
  const TensorView& Y = float_or_f64_out(a, 0);
  const int f64s = (A.dtype == DType::kF64) + (B.dtype == DType::kF64) + (Y.dtype == DType::kF64);
  if (f64s != 0 && f64s != 3)
    a.fail(std::string("A, B and Y are ") + dtype_name(A.dtype) + ", " + dtype_name(B.dtype) +
           " and " + dtype_name(Y.dtype) + ": an f64 add takes f64 A, B and Y (cast first)");
  a.numel_in(1, numel(A), "A's shape");
  a.numel_out(0, numel(A), "A's shape");
  return numel(A);
}

/// bias_add: bias (C), Y (N, C) (any rank >= 1, C its last extent).
inline void check_bias_add(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kBiasAdd, {"bias"}, {"Y"}, shapes_only, device);
  const TensorView& Y = a.float_out(0);
  a.float_in(0);
  a.rank_out(0, 1, "(N, C)");
  a.shape_in(0, {last_dim(Y)}, "(C)");
}

/// bias_grad: dY (N, C) float, dbias (C) f32.
inline void check_bias_grad(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kBiasGrad, {"dY"}, {"dbias"}, shapes_only, device);
  const TensorView& dY = a.float_in(0);
  a.f32_out(0);
  a.rank_in(0, 1, "(N, C)");
  a.shape_out(0, {last_dim(dY)}, "(C)");
}

/// cast: X, Y of f32, bf16, f16 or f64 (any pair) with the same number of elements; returns
/// that number.
inline int64_t check_cast(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kCast, {"X"}, {"Y"}, shapes_only, device);
  const TensorView& X = float_or_f64_in(a, 0);
  float_or_f64_out(a, 0);
  a.numel_out(0, numel(X), "X's shape");
  return numel(X);
}

/// scale: ScaleAttrs, X, Y float with the same number of elements; returns that number.
inline int64_t check_scale(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kScale, {"X"}, {"Y"}, shapes_only, device);
  a.attrs<ops::ScaleAttrs>();
  const TensorView& X = a.float_in(0);
  a.float_out(0);
  a.numel_out(0, numel(X), "X's shape");
  return numel(X);
}

/// sumsq: X float (any shape), out f64 (1); returns X's number of elements.
inline int64_t check_sumsq(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSumSq, {"X"}, {"out"}, shapes_only, device);
  const TensorView& X = a.float_in(0);
  a.f64_out(0);
  a.shape_out(0, {1}, "(1)");
  return numel(X);
}

/// sumsq_multi: K >= 1 inputs X[i] float of one dtype (any shapes), out f64 (1), attrs.count
/// == K; returns the total number of elements.
inline int64_t check_sumsq_multi(const OpCall* call, bool shapes_only, DeviceType device) {
  const int32_t k = call != nullptr && call->struct_size >= sizeof(OpCall) ? call->num_inputs : 0;
  std::vector<std::string> in;
  for (int32_t i = 0; i < k; ++i) in.push_back("X[" + std::to_string(i) + "]");
  OpArgs a(call, ops::kSumSqMulti, std::move(in), {"out"}, shapes_only, device);
  const ops::SumSqMultiAttrs& at = a.attrs<ops::SumSqMultiAttrs>();
  if (k < 1) a.fail("needs at least one tensor (got 0): skip the call when there is none");
  if (at.count != k)
    a.fail("attrs.count is " + std::to_string(at.count) + " but the call passes " +
           std::to_string(k) + " inputs: they must agree");
  int64_t n = 0;
  const DType dt = a.float_in(0).dtype;
  for (int32_t i = 0; i < k; ++i) {
    const TensorView& X = a.float_in(i);
    if (X.dtype != dt)
      a.fail(a.in_label(i) + " has dtype " + dtype_name(X.dtype) + ", expected X[0]'s " +
             dtype_name(dt) + ": one call takes tensors of one dtype");
    n += numel(X);
  }
  a.f64_out(0);
  a.shape_out(0, {1}, "(1)");
  return n;
}

/// amax: X float (any shape), out f32 (1); returns X's number of elements.
inline int64_t check_amax(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kAmax, {"X"}, {"out"}, shapes_only, device);
  const TensorView& X = a.float_in(0);
  a.f32_out(0);
  a.shape_out(0, {1}, "(1)");
  return numel(X);
}

}  // namespace loom::op_checks
