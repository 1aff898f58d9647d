// Learning-rate schedules, with the formulas of Megatron-Core's OptimizerParamScheduler
// (megatron/core/optimizer_param_scheduler.py, get_lr).
//
// Every schedule is a pure function of the 1-based optimizer step s (resume needs no
// state) and starts with the same linear warmup:
//
//   s <= warmup_steps:  lr(s) = warmup_init_lr + (lr - warmup_init_lr) * s / warmup_steps
//
// so step 1 already takes a warmup increment and step warmup_steps runs at the peak lr.
// lr(s) equals Megatron's get_lr() with num_steps == s. (Megatron sets the LR for the
// coming iteration from the number of iterations already done, so its first iteration
// runs at num_steps 0, i.e. at warmup_init_lr; loom's first step is s = 1. A loom run's
// LRs are Megatron's shifted by one iteration.)
//
// After the warmup, with D = decay_steps (counted from step 0, warmup included: Megatron's
// lr_decay_iters; default train_steps) and progress p = (s - warmup_steps) / (D -
// warmup_steps):
//
//   constant             lr                                   (no horizon: never decays)
//   linear               min_lr + (lr - min_lr) * (1 - p)
//   cosine               min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2
//   inverse_square_root  max(min_lr, lr * sqrt(max(warmup_steps, 1)) / sqrt(max(s, 1)))
//   wsd                  lr until s <= D - wsd_decay_steps, then
//                        min_lr + (lr - min_lr) * c(q), q = (s - (D - wsd_decay_steps)) /
//                        wsd_decay_steps, c = 1 - q (linear), (1 + cos(pi q)) / 2 (cosine),
//                        2 * 0.5^q - 1 (exponential), 1 - sqrt(q) (minus_sqrt)
//
// and every schedule but constant holds min_lr for s > D.
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>

namespace loom::optim {

/// The warmup and the options every schedule shares (manifest): lr (the peak; inherited
/// from the optimizer's lr when the node leaves it out), min_lr (0), warmup_steps (0),
/// warmup_init_lr (0), decay_steps (default train_steps), train_steps (set by the core
/// from train.steps).
class WarmupSchedule : public Object<ILrSchedule> {
 public:
  /// Warmup, then decay(step) up to the horizon, then min_lr.
  double lr(int64_t step) const noexcept final;

 protected:
  /// Whether a schedule needs the decay horizon D (decay_steps or train_steps).
  enum class Horizon { kUnused, kOptional, kRequired };

  /// Reads and checks the shared options; throws kInvalidArgument naming a bad one.
  WarmupSchedule(const nlohmann::json& options, Horizon horizon);

  /// The learning rate at a step after the warmup and not after the horizon.
  virtual double decay(int64_t step) const noexcept = 0;

  /// (step - warmup_steps) / (decay_steps - warmup_steps); requires a horizon.
  double progress(int64_t step) const noexcept;

  double peak_ = 0;
  double min_lr_ = 0;
  double warmup_init_lr_ = 0;
  int64_t warmup_steps_ = 0;
  int64_t decay_steps_ = 0;  ///< the horizon D; 0 when there is none
};

/// "constant": warmup, then lr.
class ConstantSchedule final : public WarmupSchedule {
 public:
  ConstantSchedule(const nlohmann::json& options, IBuildContext& ctx);

 private:
  double decay(int64_t step) const noexcept override;
};

/// "linear": warmup, then linear decay to min_lr at decay_steps.
class LinearSchedule final : public WarmupSchedule {
 public:
  LinearSchedule(const nlohmann::json& options, IBuildContext& ctx);

 private:
  double decay(int64_t step) const noexcept override;
};

/// "cosine": warmup, then half a cosine to min_lr at decay_steps.
class CosineSchedule final : public WarmupSchedule {
 public:
  CosineSchedule(const nlohmann::json& options, IBuildContext& ctx);

 private:
  double decay(int64_t step) const noexcept override;
};

/// "inverse_square_root": warmup, then lr * sqrt(warmup / step), floored at min_lr. The
/// horizon is optional: without decay_steps and train_steps it never drops to min_lr.
class InverseSquareRootSchedule final : public WarmupSchedule {
 public:
  InverseSquareRootSchedule(const nlohmann::json& options, IBuildContext& ctx);

 private:
  double decay(int64_t step) const noexcept override;
};

/// "wsd": warmup-stable-decay. Extra options: wsd_decay_steps (required, 1 ..
/// decay_steps - warmup_steps), wsd_decay_style ("exponential", Megatron's default;
/// "linear", "cosine", "minus_sqrt").
class WsdSchedule final : public WarmupSchedule {
 public:
  WsdSchedule(const nlohmann::json& options, IBuildContext& ctx);

 private:
  enum class Style { kLinear, kCosine, kExponential, kMinusSqrt };
  double decay(int64_t step) const noexcept override;
  int64_t wsd_decay_steps_ = 0;
  Style style_ = Style::kExponential;
};

}  // namespace loom::optim
