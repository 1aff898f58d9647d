#include "plugins/optim/lr_schedule.h"

#include <algorithm>
#include <optional>

#include "plugins/optim/options.h"

namespace loom::optim {
namespace {

std::string text(double x) { return nlohmann::json(x).dump(); }

}  // namespace

WarmupSchedule::WarmupSchedule(const nlohmann::json& options, Horizon horizon) {
  peak_ = number(options, "lr",
                 "set the peak learning rate in this node or in the optimizer's lr, which the "
                 "core hands down to the schedule");
  check_range("lr", peak_, 0, std::nullopt, "3e-4");
  min_lr_ = number(options, "min_lr");
  check_range("min_lr", min_lr_, 0, std::nullopt, "0 or lr / 10");
  if (min_lr_ > peak_)
    bad_option("min_lr", "(" + text(min_lr_) + ") is above the peak lr (" + text(peak_) +
                             "): set min_lr <= lr");
  warmup_init_lr_ = number(options, "warmup_init_lr");
  check_range("warmup_init_lr", warmup_init_lr_, 0, std::nullopt, "0");
  if (warmup_init_lr_ > peak_)
    bad_option("warmup_init_lr", "(" + text(warmup_init_lr_) + ") is above the peak lr (" +
                                     text(peak_) + "): set warmup_init_lr <= lr");
  warmup_steps_ = integer(options, "warmup_steps");
  if (warmup_steps_ < 0)
    bad_option("warmup_steps", "must be >= 0, got " + std::to_string(warmup_steps_));

  std::optional<int64_t> decay_steps = optional_integer(options, "decay_steps");
  std::optional<int64_t> train_steps = optional_integer(options, "train_steps");
  if (decay_steps && *decay_steps < 1)
    bad_option("decay_steps", "must be >= 1, got " + std::to_string(*decay_steps));
  if (train_steps && *train_steps < 1)
    bad_option("train_steps", "must be >= 1, got " + std::to_string(*train_steps));
  if (horizon == Horizon::kUnused) return;
  std::string source = decay_steps ? "" : ", from train.steps";
  if (!decay_steps) decay_steps = train_steps;
  if (!decay_steps) {
    if (horizon == Horizon::kOptional) return;
    bad_option("decay_steps",
               "is missing: set decay_steps (the step at which the LR reaches min_lr) or "
               "train.steps, its default");
  }
  if (warmup_steps_ >= *decay_steps)
    bad_option("warmup_steps", "(" + std::to_string(warmup_steps_) +
                                   ") must be less than decay_steps (" +
                                   std::to_string(*decay_steps) + source +
                                   "), which counts the warmup too: shorten the warmup or "
                                   "lengthen decay_steps");
  decay_steps_ = *decay_steps;
}

double WarmupSchedule::lr(int64_t step) const noexcept {
  int64_t s = std::max<int64_t>(step, 0);
  if (warmup_steps_ > 0 && s <= warmup_steps_)
    return warmup_init_lr_ +
           (peak_ - warmup_init_lr_) * static_cast<double>(s) / static_cast<double>(warmup_steps_);
  if (decay_steps_ > 0 && s > decay_steps_) return min_lr_;
  return decay(s);
}

double WarmupSchedule::progress(int64_t step) const noexcept {
  double p =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(decay_steps_ - warmup_steps_);
  return std::clamp(p, 0.0, 1.0);
}

}  // namespace loom::optim
