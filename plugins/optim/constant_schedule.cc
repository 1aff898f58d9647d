// "constant": warmup, then the peak lr for ever (Megatron's lr_decay_style "constant").
#include "plugins/optim/lr_schedule.h"

namespace loom::optim {

ConstantSchedule::ConstantSchedule(const nlohmann::json& options, IBuildContext&)
    : WarmupSchedule(options, Horizon::kUnused) {}

double ConstantSchedule::decay(int64_t) const noexcept { return peak_; }

}  // namespace loom::optim
