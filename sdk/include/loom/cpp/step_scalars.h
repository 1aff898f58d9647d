// The optimizer ops' step scalars (loom/ops/optim.h): "grad_norm_clip"'s arithmetic and the
// reads of a call's lr, step, gradient scale and skip flag, the same on the host and on a
// device. grad_norm_clip's expressions are those of the trainer's direct step
// (core/train/trainer.cc, core/optim/distributed_optimizer.cc), so a step whose scalars a
// device computed takes the same values to the bit.
#pragma once

#include <math.h>
#include <stdint.h>

#include "loom/cpp/host_device.h"
#include "loom/ops.h"

namespace loom {

/// "grad_norm_clip" on the step scalars `s` (ops::kStepScalarCount f64): writes the norm
/// sqrt(sumsq) / s[kStepNormDivisor], sets the skip flag when the norm is not finite, else
/// multiplies the gradient scale by max_norm / (norm + 1e-6) when max_norm > 0 and that is
/// below 1. Returns the norm.
LOOM_HOST_DEVICE inline double grad_norm_clip(double sumsq, double max_norm, double* s) {
  const double norm = sqrt(sumsq) / s[ops::kStepNormDivisor];
  s[ops::kStepGradNorm] = norm;
  // Finite: inf - inf and NaN - NaN are NaN (no isfinite, which differs between the two).
  const bool finite = norm - norm == 0.0;
  if (s[ops::kStepSkip] != 0.0 || !finite) {
    s[ops::kStepSkip] = 1.0;
    return norm;
  }
  if (max_norm > 0) {
    const double coeff = max_norm / (norm + 1e-6);
    if (coeff < 1) s[ops::kStepGradScale] *= coeff;
  }
  return norm;
}

/// Whether the step scalars `s` say to skip the update (null: no scalars, never).
LOOM_HOST_DEVICE inline bool step_skipped(const double* s) {
  return s != nullptr && s[ops::kStepSkip] != 0.0;
}

/// An sgd_step call's attrs `a`, with lr, grad scale and step from its step scalars `s`
/// when present (null: `a` as it is), converted as a caller converts them into the attrs.
LOOM_HOST_DEVICE inline ops::SgdAttrs sgd_attrs(ops::SgdAttrs a, const double* s) {
  if (s != nullptr) {
    a.lr = static_cast<float>(s[ops::kStepLr]);
    a.grad_scale = static_cast<float>(s[ops::kStepGradScale]);
    a.step = static_cast<int64_t>(s[ops::kStepIndex]);
  }
  return a;
}

}  // namespace loom
