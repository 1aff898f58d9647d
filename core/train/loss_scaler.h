// LossScaler: dynamic loss scaling for f16 parameters, as Megatron's DynamicGradScaler: the
// loss gradient is multiplied by the scale; a step whose gradients overflow (non-finite) is
// skipped; the `hysteresis`-th such step since the scale last grew halves it, and so does
// every one after it (not below the minimum); after `window` good steps in a row it doubles
// and the hysteresis is restored. Without dynamic scaling the scale is 1 and
// never changes. Its state is part of a checkpoint, for an exact resume.
#pragma once

#include <cstdint>

#include "core/train/run_config.h"

namespace loom::core {

class LossScaler {
 public:
  /// Dynamic when precision.dynamic_loss_scaling() (f16 parameters), else a constant 1.
  explicit LossScaler(const PrecisionConfig& precision);

  bool dynamic() const { return dynamic_; }
  /// The scale of the next step's loss gradient.
  double scale() const { return scale_; }
  /// After a step: `overflow` when its loss or gradients were not finite.
  void update(bool overflow);

  /// What a checkpoint keeps (and restore puts back).
  struct State {
    double scale = 1;
    int64_t good_steps = 0;
    int64_t hysteresis_left = 0;
  };
  State state() const { return {scale_, good_steps_, hysteresis_left_}; }
  void restore(const State& state);

 private:
  bool dynamic_ = false;
  double scale_ = 1, min_scale_ = 1;
  int64_t window_ = 1000, hysteresis_ = 2, hysteresis_left_ = 2, good_steps_ = 0;
};

}  // namespace loom::core
