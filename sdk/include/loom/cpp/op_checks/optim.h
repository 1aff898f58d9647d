// Argument checks of the optimizer steps of loom/ops.h (adamw_step, sgd_step), shared by
// every kernel library so that the CPU and CUDA kernels reject a bad call with the same
// words (header-only; see loom/cpp/op_args.h). Each returns n, the elements of the shard.
//   call:         the call
//   shapes_only:  true inside `supports` (data may be null)
//   device:       the device family of the kernel
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// adamw_step: AdamWAttrs (step >= 1), grad float (n), master / exp_avg / exp_avg_sq f32
/// (n), param float (n) or empty.
inline int64_t check_adamw_step(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kAdamWStep, {"grad"}, {"master", "exp_avg", "exp_avg_sq", "param"},
           shapes_only, device);
  const ops::AdamWAttrs& at = a.attrs<ops::AdamWAttrs>();
  if (at.step < 1) a.fail("step = " + std::to_string(at.step) + " must be >= 1 (1-based)");
  int64_t n = numel(a.float_in(0));
  for (int i = 0; i < 3; ++i) {
    a.f32_out(i);
    a.numel_out(i, n, "grad's shape");
  }
  if (a.opt_float_out(3)) a.numel_out(3, n, "grad's shape");
  return n;
}

/// sgd_step: SgdAttrs (step >= 1), grad float (n), master f32 (n), momentum buffer f32 (n)
/// (required when momentum != 0), param float (n) or empty.
inline int64_t check_sgd_step(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSgdStep, {"grad"}, {"master", "momentum_buffer", "param"}, shapes_only,
           device);
  const ops::SgdAttrs& at = a.attrs<ops::SgdAttrs>();
  if (at.step < 1) a.fail("step = " + std::to_string(at.step) + " must be >= 1 (1-based)");
  int64_t n = numel(a.float_in(0));
  a.f32_out(0);
  a.numel_out(0, n, "grad's shape");
  if (at.momentum != 0.0f) {
    a.f32_out(1);
    a.numel_out(1, n, "grad's shape");
  }
  if (a.opt_float_out(2)) a.numel_out(2, n, "grad's shape");
  return n;
}

}  // namespace loom::op_checks
