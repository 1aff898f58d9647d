// "inverse_square_root": warmup, then lr * sqrt(warmup / step) (the Transformer paper's
// schedule, Megatron's "inverse-square-root"), floored at min_lr.
#include <algorithm>
#include <cmath>

#include "plugins/optim/lr_schedule.h"

namespace loom::optim {

InverseSquareRootSchedule::InverseSquareRootSchedule(const nlohmann::json& options, IBuildContext&)
    : WarmupSchedule(options, Horizon::kOptional) {}

double InverseSquareRootSchedule::decay(int64_t step) const noexcept {
  double warmup = static_cast<double>(std::max<int64_t>(warmup_steps_, 1));
  double s = static_cast<double>(std::max<int64_t>(step, 1));
  return std::max(min_lr_, peak_ * std::sqrt(warmup) / std::sqrt(s));
}

}  // namespace loom::optim
