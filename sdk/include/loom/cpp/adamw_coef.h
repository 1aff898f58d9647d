// The per-call coefficients of "adamw_step" and "adamw_step_multi" (loom/ops.h), computed the
// same way by every kernel library, on the host from a call's attrs or on a device from its
// step scalars (loom/ops/optim.h): the bias corrections in f64, rounded once to f32.
// Libraries that also share the per-element formula then agree bit for bit, and so do a
// call with step scalars and the same call with those values in its attrs.
#pragma once

#include <math.h>
#include <stdint.h>

#include "loom/cpp/host_device.h"
#include "loom/ops.h"

namespace loom {

/// What the per-element AdamW update reads (plain data: a CUDA kernel takes it by value).
struct AdamWCoef {
  float lr, b1, b2, eps;
  float wd;        ///< weight decay of this shard (0 without decay)
  float gs;        ///< gradient scale (1 / loss scale, times the clipping factor)
  float bc1;       ///< 1 / (1 - b1^t)
  float bc2_sqrt;  ///< 1 / sqrt(1 - b2^t)
};

/// base^t for t >= 0, by repeated squaring in f64: the same operations in the same order on
/// the host and on a device (a library's pow() may differ in the last bit between them).
LOOM_HOST_DEVICE inline double adamw_power(double base, int64_t t) {
  double result = 1.0;
  while (t > 0) {
    if (t & 1) result *= base;
    base *= base;
    t >>= 1;
  }
  return result;
}

/// The coefficients of step `step` (1-based) for one shard.
LOOM_HOST_DEVICE inline AdamWCoef adamw_coef(float lr, float beta1, float beta2, float eps,
                                             float weight_decay, float grad_scale, int64_t step) {
  return AdamWCoef{
      lr,
      beta1,
      beta2,
      eps,
      weight_decay,
      grad_scale,
      static_cast<float>(1.0 / (1.0 - adamw_power(static_cast<double>(beta1), step))),
      static_cast<float>(1.0 / sqrt(1.0 - adamw_power(static_cast<double>(beta2), step)))};
}

/// Of an adamw_step call.
inline AdamWCoef adamw_coef(const ops::AdamWAttrs& a) {
  return adamw_coef(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step);
}

/// Of shard `i` of an adamw_step_multi call (only the weight decay differs between shards).
inline AdamWCoef adamw_coef(const ops::AdamWMultiAttrs& a, int32_t i) {
  return adamw_coef(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay[i], a.grad_scale, a.step);
}

/// `c` (the attrs' coefficients) with lr, grad scale and step taken from a call's step
/// scalars `s` (ops::kStepScalarCount f64, where the kernel runs), converted as the attrs
/// are: lr and grad scale rounded to f32, the step truncated.
LOOM_HOST_DEVICE inline AdamWCoef adamw_coef(const AdamWCoef& c, const double* s) {
  return adamw_coef(static_cast<float>(s[ops::kStepLr]), c.b1, c.b2, c.eps, c.wd,
                    static_cast<float>(s[ops::kStepGradScale]),
                    static_cast<int64_t>(s[ops::kStepIndex]));
}

}  // namespace loom
