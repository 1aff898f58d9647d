// The per-call coefficients of "adamw_step" and "adamw_step_multi" (loom/ops.h), computed on
// the host the same way by every kernel library: the bias corrections in f64, rounded once
// to f32. Libraries that also share the per-element formula then agree bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

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

/// The coefficients of step `step` (1-based) for one shard.
inline AdamWCoef adamw_coef(float lr, float beta1, float beta2, float eps, float weight_decay,
                            float grad_scale, int64_t step) {
  const double t = static_cast<double>(step);
  return AdamWCoef{
      lr,
      beta1,
      beta2,
      eps,
      weight_decay,
      grad_scale,
      static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), t))),
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(beta2), t)))};
}

/// Of an adamw_step call.
inline AdamWCoef adamw_coef(const ops::AdamWAttrs& a) {
  return adamw_coef(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step);
}

/// Of shard `i` of an adamw_step_multi call (only the weight decay differs between shards).
inline AdamWCoef adamw_coef(const ops::AdamWMultiAttrs& a, int32_t i) {
  return adamw_coef(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay[i], a.grad_scale, a.step);
}

}  // namespace loom
