// Argument checks of dropout_fwd / dropout_bwd (loom/ops.h), shared by every kernel library
// so that all of them refuse a bad call with the same words. Each check throws
// loom::Error(kInvalidArgument) naming the op; `shapes_only` is true inside a kernel's
// `supports` (data may be null there), and `device` is the family of the calling kernel.
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// Both directions: one float input and one float output of the same element count, and
/// DropoutAttrs with p in [0, 1). `in` / `out` name the tensors ("X" / "Y", "dY" / "dX").
/// Returns the element count.
inline int64_t check_dropout(const OpCall* call, bool shapes_only, DeviceType device,
                             const char* op, const char* in, const char* out) {
  OpArgs a(call, op, {in}, {out}, shapes_only, device);
  const ops::DropoutAttrs& at = a.attrs<ops::DropoutAttrs>();
  if (!(at.p >= 0.0f && at.p < 1.0f))
    a.fail("drop probability p = " + std::to_string(at.p) + " must be in [0, 1)");
  int64_t n = numel(a.float_in(0));
  a.float_out(0);
  a.numel_out(0, n, "the input's shape");
  return n;
}

inline int64_t check_dropout_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_dropout(call, shapes_only, device, ops::kDropoutFwd, "X", "Y");
}

inline int64_t check_dropout_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_dropout(call, shapes_only, device, ops::kDropoutBwd, "dY", "dX");
}

}  // namespace loom::op_checks
