// "cosine": warmup, then half a cosine period from lr to min_lr at decay_steps
// (Loshchilov & Hutter's SGDR without restarts, as Megatron's "cosine").
#include <cmath>
#include <numbers>

#include "plugins/optim/lr_schedule.h"

namespace loom::optim {

CosineSchedule::CosineSchedule(const nlohmann::json& options, IBuildContext&)
    : WarmupSchedule(options, Horizon::kRequired) {}

double CosineSchedule::decay(int64_t step) const noexcept {
  return min_lr_ + (peak_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress(step)));
}

}  // namespace loom::optim
