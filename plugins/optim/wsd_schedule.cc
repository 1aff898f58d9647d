// "wsd": warmup-stable-decay (Hu et al., MiniCPM; Megatron's "WSD"): the peak lr until the
// last wsd_decay_steps steps before decay_steps, then an annealing phase to min_lr.
#include <cmath>
#include <numbers>
#include <string>

#include "plugins/optim/lr_schedule.h"
#include "plugins/optim/options.h"

namespace loom::optim {

WsdSchedule::WsdSchedule(const nlohmann::json& options, IBuildContext&)
    : WarmupSchedule(options, Horizon::kRequired) {
  std::optional<int64_t> wsd = optional_integer(options, "wsd_decay_steps");
  if (!wsd)
    bad_option("wsd_decay_steps",
               "is missing: set the length of the final decay phase, e.g. a tenth of "
               "decay_steps");
  int64_t room = decay_steps_ - warmup_steps_;
  if (*wsd < 1 || *wsd > room)
    bad_option("wsd_decay_steps", "must be in [1, decay_steps - warmup_steps] = [1, " +
                                      std::to_string(room) + "], got " + std::to_string(*wsd) +
                                      ": the decay phase starts after the warmup");
  wsd_decay_steps_ = *wsd;
  std::string style = string_or(options, "wsd_decay_style", "exponential");
  if (style == "linear") {
    style_ = Style::kLinear;
  } else if (style == "cosine") {
    style_ = Style::kCosine;
  } else if (style == "exponential") {
    style_ = Style::kExponential;
  } else if (style == "minus_sqrt") {
    style_ = Style::kMinusSqrt;
  } else {
    bad_option("wsd_decay_style",
               "must be one of \"linear\", \"cosine\", \"exponential\", "
               "\"minus_sqrt\", got \"" +
                   style + "\"");
  }
}

double WsdSchedule::decay(int64_t step) const noexcept {
  int64_t anneal_start = decay_steps_ - wsd_decay_steps_;
  if (step <= anneal_start) return peak_;
  double q = static_cast<double>(step - anneal_start) / static_cast<double>(wsd_decay_steps_);
  double coeff = 0;
  switch (style_) {
    case Style::kLinear:
      coeff = 1.0 - q;
      break;
    case Style::kCosine:
      coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * q));
      break;
    case Style::kExponential:
      coeff = 2.0 * std::pow(0.5, q) - 1.0;
      break;
    case Style::kMinusSqrt:
      coeff = 1.0 - std::sqrt(q);
      break;
  }
  return min_lr_ + (peak_ - min_lr_) * coeff;
}

}  // namespace loom::optim
