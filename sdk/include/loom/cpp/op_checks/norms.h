// Argument checks of layernorm_fwd / layernorm_bwd and rmsnorm_fwd / rmsnorm_bwd
// (loom/ops.h), shared by every kernel library so that all of them refuse a bad call with
// the same words. Each check throws loom::Error(kInvalidArgument) naming the op;
// `shapes_only` is true inside a kernel's `supports` (data may be null there), and `device`
// is the family of the calling kernel.
#pragma once

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// Rows, row width and attributes of a norm call: X is (n, c).
struct NormShape {
  int64_t n, c;
  ops::NormAttrs attrs;
};

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
/// dweight f32 (C) +=, dbias f32 (C) += or empty.
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
/// dweight f32 (C) +=.
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
  return s;
}

}  // namespace loom::op_checks
