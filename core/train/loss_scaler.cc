#include "core/train/loss_scaler.h"

#include <algorithm>

namespace loom::core {

LossScaler::LossScaler(const PrecisionConfig& precision)
    : dynamic_(precision.dynamic_loss_scaling()) {
  if (!dynamic_) return;
  scale_ = precision.initial_loss_scale;
  min_scale_ = precision.min_loss_scale;
  window_ = precision.loss_scale_window;
  hysteresis_ = hysteresis_left_ = precision.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    good_steps_ = 0;
    // Spent hysteresis stays spent until the scale grows again (Megatron does not restore
    // it on a backoff either): after the first `hysteresis` overflows, each one halves.
    if (hysteresis_left_ > 0) --hysteresis_left_;
    if (hysteresis_left_ == 0) scale_ = std::max(scale_ * 0.5, min_scale_);
  } else if (++good_steps_ >= window_) {
    scale_ *= 2;
    good_steps_ = 0;
    hysteresis_left_ = hysteresis_;
  }
}

void LossScaler::restore(const State& state) {
  scale_ = state.scale;
  good_steps_ = state.good_steps;
  hysteresis_left_ = state.hysteresis_left;
}

}  // namespace loom::core
