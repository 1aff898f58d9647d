// Argument checks of rope_fwd / rope_bwd (loom/ops.h), shared by every kernel library so
// that all of them refuse a bad call with the same words. Each check throws
// loom::Error(kInvalidArgument) naming the op; `shapes_only` is true inside a kernel's
// `supports` (data may be null there), and `device` is the family of the calling kernel.
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// X is (b, t, h, d); `half` = rotary_dim / 2 channel pairs are rotated. X and Y may have
/// strided rows (views of a fused QKV projection, rotated in place).
struct RopeShape {
  int64_t b, t, h, d, half;
  RowStrides x{}, y{};  ///< row strides of X and Y
};

/// Both directions: X float (B, T, H, D), positions i32 (B, T) or empty, inv_freq f32
/// (rotary_dim / 2) -> Y float (B, T, H, D); RopeAttrs with an even rotary_dim <= D. X and
/// Y may have strided rows (OpArgs::float_rows_in); Y is X or does not overlap it.
inline RopeShape check_rope(const OpCall* call, bool shapes_only, DeviceType device,
                            const char* op) {
  OpArgs a(call, op, {"X", "positions", "inv_freq"}, {"Y"}, shapes_only, device);
  const ops::RopeAttrs& at = a.attrs<ops::RopeAttrs>();
  const TensorView& X = a.float_rows_in(0);
  if (X.ndim != 4)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(X) + ", expected (B, T, H, D)");
  RopeShape s{X.shape[0], X.shape[1], X.shape[2], X.shape[3], at.rotary_dim / 2};
  if (at.rotary_dim < 0 || at.rotary_dim % 2 != 0 || at.rotary_dim > s.d)
    a.fail("rotary_dim = " + std::to_string(at.rotary_dim) +
           " must be even and in [0, D = " + std::to_string(s.d) + "]");
  if (a.opt_i32_in(1)) a.shape_in(1, {s.b, s.t}, "(B, T)");
  a.f32_in(2);
  a.shape_in(2, {s.half}, "(rotary_dim / 2)");
  const TensorView& Y = a.float_rows_out(0);
  a.shape_out(0, {s.b, s.t, s.h, s.d}, "X's shape (B, T, H, D)");
  s.x = RowStrides::of(X), s.y = RowStrides::of(Y);
  return s;
}

inline RopeShape check_rope_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_rope(call, shapes_only, device, ops::kRopeFwd);
}

inline RopeShape check_rope_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_rope(call, shapes_only, device, ops::kRopeBwd);
}

}  // namespace loom::op_checks
