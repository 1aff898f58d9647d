// Argument checks of layernorm_fwd / layernorm_bwd, rmsnorm_fwd / rmsnorm_bwd and their
// residual-add forms add_layernorm_* / add_rmsnorm_* (loom/ops.h), shared by every kernel library
// so that all of them refuse a bad call with the same words. Each check throws
// loom::Error(kInvalidArgument) naming the op; `shapes_only` is true inside a kernel's `supports`
// (data may be null there), and `device` is the family of the calling kernel.
#pragma once

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// Rows, row width and attributes of a norm call: X is (n, c).
struct NormShape {
  int64_t n, c;
  ops::NormAttrs attrs;
};

/// A backward's dX (output 0) must not alias its inputs `in`: the kernels read them again
/// after writing dX (the weight gradients of the CUDA warp-per-row kernels, dZ's add).
inline void refuse_dx_alias(const OpArgs& a, int64_t numel, std::initializer_list<int> in) {
  if (a.shapes_only() || numel == 0) return;
  for (int i : in)
    if (a.out(0).data == a.in(i).data)
      a.fail("dX aliases " + a.in_label(i) + ": give dX a buffer of its own");
}

/// layernorm_fwd: X (N, C), weight (C), bias (C) or empty -> Y (N, C), mean f32 (N),
/// rstd f32 (N).
inline NormShape check_layernorm_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kLayerNormFwd, {"X", "weight", "bias"}, {"Y", "mean", "rstd"}, shapes_only,
           device);
  NormShape s{0, 0, a.attrs<ops::NormAttrs>()};
  const TensorView& X = a.float_in(0);
  a.rank_in(0, 1, "(N, C)");
  s.n = rows_of(X);
  s.c = last_dim(X);
  a.float_in(1);
  a.shape_in(1, {s.c}, "(C)");
  if (a.opt_float_in(2)) a.shape_in(2, {s.c}, "(C)");
  a.float_out(0);
  a.numel_out(0, s.n * s.c, "X's shape (N, C)");
  a.f32_out(1);
  a.numel_out(1, s.n, "(N)");
  a.f32_out(2);
  a.numel_out(2, s.n, "(N)");
  return s;
}

/// layernorm_bwd: dY (N, C), X (N, C), weight (C), mean f32 (N), rstd f32 (N) -> dX (N, C),
/// dweight f32 (C) +=, dbias f32 (C) += or empty. dX aliases neither dY nor X.
inline NormShape check_layernorm_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kLayerNormBwd, {"dY", "X", "weight", "mean", "rstd"},
           {"dX", "dweight", "dbias"}, shapes_only, device);
  NormShape s{0, 0, a.attrs<ops::NormAttrs>()};
  const TensorView& X = a.float_in(1);
  a.rank_in(1, 1, "(N, C)");
  s.n = rows_of(X);
  s.c = last_dim(X);
  a.float_in(0);
  a.numel_in(0, s.n * s.c, "X's shape (N, C)");
  a.float_in(2);
  a.shape_in(2, {s.c}, "(C)");
  a.f32_in(3);
  a.numel_in(3, s.n, "(N)");
  a.f32_in(4);
  a.numel_in(4, s.n, "(N)");
  a.float_out(0);
  a.numel_out(0, s.n * s.c, "X's shape (N, C)");
  a.f32_out(1);
  a.shape_out(1, {s.c}, "(C)");
  if (a.opt_f32_out(2)) a.shape_out(2, {s.c}, "(C)");
  refuse_dx_alias(a, s.n * s.c, {0, 1});
  return s;
}

/// rmsnorm_fwd: X (N, C), weight (C) -> Y (N, C), rstd f32 (N).
inline NormShape check_rmsnorm_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kRmsNormFwd, {"X", "weight"}, {"Y", "rstd"}, shapes_only, device);
  NormShape s{0, 0, a.attrs<ops::NormAttrs>()};
  const TensorView& X = a.float_in(0);
  a.rank_in(0, 1, "(N, C)");
  s.n = rows_of(X);
  s.c = last_dim(X);
  a.float_in(1);
  a.shape_in(1, {s.c}, "(C)");
  a.float_out(0);
  a.numel_out(0, s.n * s.c, "X's shape (N, C)");
  a.f32_out(1);
  a.numel_out(1, s.n, "(N)");
  return s;
}

/// rmsnorm_bwd: dY (N, C), X (N, C), weight (C), rstd f32 (N) -> dX (N, C),
/// dweight f32 (C) +=. dX aliases neither dY nor X.
inline NormShape check_rmsnorm_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kRmsNormBwd, {"dY", "X", "weight", "rstd"}, {"dX", "dweight"}, shapes_only,
           device);
  NormShape s{0, 0, a.attrs<ops::NormAttrs>()};
  const TensorView& X = a.float_in(1);
  a.rank_in(1, 1, "(N, C)");
  s.n = rows_of(X);
  s.c = last_dim(X);
  a.float_in(0);
  a.numel_in(0, s.n * s.c, "X's shape (N, C)");
  a.float_in(2);
  a.shape_in(2, {s.c}, "(C)");
  a.f32_in(3);
  a.numel_in(3, s.n, "(N)");
  a.float_out(0);
  a.numel_out(0, s.n * s.c, "X's shape (N, C)");
  a.f32_out(1);
  a.shape_out(1, {s.c}, "(C)");
  refuse_dx_alias(a, s.n * s.c, {0, 1});
  return s;
}

/// The views at `in` (inputs) and `out` (outputs) of a call have `first`'s dtype; names the
/// first that differs.
inline void same_dtype(const OpArgs& a, const TensorView& first, const char* first_name,
                       std::initializer_list<int> in, std::initializer_list<int> out) {
  auto check = [&](const TensorView& v, const std::string& label) {
    if (v.dtype != first.dtype)
      a.fail(label + " has dtype " + dtype_name(v.dtype) + ", expected " + first_name + "'s " +
             dtype_name(first.dtype) +
             ": the residual, its sum and their gradients share one dtype");
  };
  for (int i : in) check(a.in(i), a.in_label(i));
  for (int i : out) check(a.out(i), a.out_label(i));
}

/// add_layernorm_fwd (kRms false) / add_rmsnorm_fwd (kRms true): X (N, C), R (N, C),
/// weight (C)[, bias (C) or empty] -> Y (N, C), Z (N, C)[, mean f32 (N)], rstd f32 (N).
template <bool kRms>
inline NormShape check_add_norm_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a = kRms ? OpArgs(call, ops::kAddRmsNormFwd, {"X", "R", "weight"}, {"Y", "Z", "rstd"},
                           shapes_only, device)
                  : OpArgs(call, ops::kAddLayerNormFwd, {"X", "R", "weight", "bias"},
                           {"Y", "Z", "mean", "rstd"}, shapes_only, device);
  NormShape s{0, 0, a.attrs<ops::NormAttrs>()};
  const TensorView& X = a.float_in(0);
  a.rank_in(0, 1, "(N, C)");
  s.n = rows_of(X);
  s.c = last_dim(X);
  a.float_in(1);
  a.numel_in(1, s.n * s.c, "X's shape (N, C)");
  a.float_in(2);
  a.shape_in(2, {s.c}, "(C)");
  if (!kRms && a.opt_float_in(3)) a.shape_in(3, {s.c}, "(C)");
  for (int o = 0; o < 2; ++o) {
    a.float_out(o);
    a.numel_out(o, s.n * s.c, "X's shape (N, C)");
  }
  same_dtype(a, X, "X", {1}, {0, 1});
  for (int o = 2; o < (kRms ? 3 : 4); ++o) {
    a.f32_out(o);
    a.numel_out(o, s.n, "(N)");
  }
  return s;
}

/// add_layernorm_bwd (kRms false) / add_rmsnorm_bwd (kRms true): dY (N, C), Z (N, C),
/// weight (C)[, mean f32 (N)], rstd f32 (N), dZ (N, C) -> dX (N, C), dweight f32 (C) +=
/// [, dbias f32 (C) += or empty]. dX aliases none of dY, Z, dZ.
template <bool kRms>
inline NormShape check_add_norm_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a = kRms ? OpArgs(call, ops::kAddRmsNormBwd, {"dY", "Z", "weight", "rstd", "dZ"},
                           {"dX", "dweight"}, shapes_only, device)
                  : OpArgs(call, ops::kAddLayerNormBwd, {"dY", "Z", "weight", "mean", "rstd", "dZ"},
                           {"dX", "dweight", "dbias"}, shapes_only, device);
  NormShape s{0, 0, a.attrs<ops::NormAttrs>()};
  const int dz = kRms ? 4 : 5;
  const TensorView& Z = a.float_in(1);
  a.rank_in(1, 1, "(N, C)");
  s.n = rows_of(Z);
  s.c = last_dim(Z);
  a.float_in(0);
  a.numel_in(0, s.n * s.c, "Z's shape (N, C)");
  a.float_in(2);
  a.shape_in(2, {s.c}, "(C)");
  for (int i = 3; i < dz; ++i) {
    a.f32_in(i);
    a.numel_in(i, s.n, "(N)");
  }
  a.float_in(dz);
  a.numel_in(dz, s.n * s.c, "Z's shape (N, C)");
  a.float_out(0);
  a.numel_out(0, s.n * s.c, "Z's shape (N, C)");
  same_dtype(a, Z, "Z", {0, dz}, {0});
  a.f32_out(1);
  a.shape_out(1, {s.c}, "(C)");
  if (!kRms && a.opt_f32_out(2)) a.shape_out(2, {s.c}, "(C)");
  refuse_dx_alias(a, s.n * s.c, {0, 1, dz});
  return s;
}

}  // namespace loom::op_checks
