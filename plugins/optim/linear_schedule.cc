// "linear": warmup, then a straight line from lr to min_lr at decay_steps.
#include "plugins/optim/lr_schedule.h"

namespace loom::optim {

LinearSchedule::LinearSchedule(const nlohmann::json& options, IBuildContext&)
    : WarmupSchedule(options, Horizon::kRequired) {}

double LinearSchedule::decay(int64_t step) const noexcept {
  return min_lr_ + (peak_ - min_lr_) * (1.0 - progress(step));
}

}  // namespace loom::optim
