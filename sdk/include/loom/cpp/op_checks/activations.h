// Argument checks of gelu_fwd / gelu_bwd and swiglu_fwd / swiglu_bwd (loom/ops.h), shared by
// every kernel library so that all of them refuse a bad call with the same words. Each check
// throws loom::Error(kInvalidArgument) naming the op; `shapes_only` is true inside a kernel's
// `supports` (data may be null there), and `device` is the family of the calling kernel.
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// gelu_fwd: X and Y of the same element count; returns that count.
inline int64_t check_gelu_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kGeluFwd, {"X"}, {"Y"}, shapes_only, device);
  a.attrs<ops::GeluAttrs>();
  int64_t n = numel(a.float_in(0));
  a.float_out(0);
  a.numel_out(0, n, "X's shape");
  return n;
}

/// gelu_bwd: dY, X and dX of the same element count; returns that count.
inline int64_t check_gelu_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kGeluBwd, {"dY", "X"}, {"dX"}, shapes_only, device);
  a.attrs<ops::GeluAttrs>();
  int64_t n = numel(a.float_in(0));
  a.float_in(1);
  a.float_out(0);
  a.numel_in(1, n, "dY's shape");
  a.numel_out(0, n, "dY's shape");
  return n;
}

/// Rows and half width of a swiglu call: X is (n, 2f), Y / dY (n, f).
struct SwigluShape {
  int64_t n, f;
};

/// swiglu_fwd: X (N, 2F) -> Y (N, F).
inline SwigluShape check_swiglu_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSwigluFwd, {"X"}, {"Y"}, shapes_only, device);
  const TensorView& X = a.float_in(0);
  const TensorView& Y = a.float_out(0);
  a.rank_in(0, 1, "(N, 2F)");
  if (last_dim(X) % 2 != 0)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(X) +
           ": its last dimension (2F: gate then up projection) must be even");
  SwigluShape s{rows_of(X), last_dim(X) / 2};
  if (Y.ndim < 1 || last_dim(Y) != s.f || rows_of(Y) != s.n)
    a.fail(a.out_label(0) + " has shape " + view_shape_str(Y) +
           ", expected (N, F) with N = " + std::to_string(s.n) + ", F = " + std::to_string(s.f));
  return s;
}

/// swiglu_bwd: dY (N, F), X (N, 2F) -> dX (N, 2F).
inline SwigluShape check_swiglu_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSwigluBwd, {"dY", "X"}, {"dX"}, shapes_only, device);
  const TensorView& dY = a.float_in(0);
  const TensorView& X = a.float_in(1);
  a.float_out(0);
  a.rank_in(1, 1, "(N, 2F)");
  if (last_dim(X) % 2 != 0)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(X) + ": its last dimension must be even");
  SwigluShape s{rows_of(X), last_dim(X) / 2};
  if (dY.ndim < 1 || last_dim(dY) != s.f || rows_of(dY) != s.n)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(dY) +
           ", expected (N, F) with N = " + std::to_string(s.n) + ", F = " + std::to_string(s.f));
  a.numel_out(0, numel(X), "X's shape (N, 2F)");
  return s;
}

}  // namespace loom::op_checks
