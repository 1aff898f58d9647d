// Argument checks of masked_softmax_fwd / masked_softmax_bwd (loom/ops.h), shared by every
// kernel library so that all of them refuse a bad call with the same words. Each check
// throws loom::Error(kInvalidArgument) naming the op; `shapes_only` is true inside a
// kernel's `supports` (data may be null there), and `device` is the family of the calling
// kernel.
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// Scores are (b, h, t, sk): B batch rows, H heads, T queries, Sk keys.
struct SoftmaxShape {
  int64_t b, h, t, sk;
  ops::SoftmaxAttrs attrs;
};

/// masked_softmax_fwd: S float (B, H, T, Sk), segment ids i32 (B, T) or empty -> P float
/// (B, H, T, Sk); segment ids need T == Sk.
inline SoftmaxShape check_softmax_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMaskedSoftmaxFwd, {"S", "segment_ids"}, {"P"}, shapes_only, device);
  SoftmaxShape s{0, 0, 0, 0, a.attrs<ops::SoftmaxAttrs>()};
  const TensorView& S = a.float_in(0);
  if (S.ndim != 4)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(S) + ", expected (B, H, T, Sk)");
  s.b = S.shape[0], s.h = S.shape[1], s.t = S.shape[2], s.sk = S.shape[3];
  if (a.opt_i32_in(1)) {
    a.shape_in(1, {s.b, s.t}, "(B, T)");
    if (s.t != s.sk)
      a.fail("segment ids need as many keys as queries (T = " + std::to_string(s.t) +
             ", Sk = " + std::to_string(s.sk) + ")");
  }
  a.float_out(0);
  a.shape_out(0, {s.b, s.h, s.t, s.sk}, "S's shape (B, H, T, Sk)");
  return s;
}

/// masked_softmax_bwd: dP, P float (B, H, T, Sk) -> dS float (B, H, T, Sk).
inline SoftmaxShape check_softmax_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMaskedSoftmaxBwd, {"dP", "P"}, {"dS"}, shapes_only, device);
  SoftmaxShape s{0, 0, 0, 0, a.attrs<ops::SoftmaxAttrs>()};
  const TensorView& dP = a.float_in(0);
  if (dP.ndim != 4)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(dP) + ", expected (B, H, T, Sk)");
  s.b = dP.shape[0], s.h = dP.shape[1], s.t = dP.shape[2], s.sk = dP.shape[3];
  a.float_in(1);
  a.shape_in(1, {s.b, s.h, s.t, s.sk}, "dP's shape (B, H, T, Sk)");
  a.float_out(0);
  a.shape_out(0, {s.b, s.h, s.t, s.sk}, "dP's shape (B, H, T, Sk)");
  return s;
}

}  // namespace loom::op_checks
