#include "plugins/optim/adamw.h"

#include <loom/cpp/tensor.h>

#include <cmath>
#include <string>

#include "plugins/optim/options.h"

namespace loom::optim {
namespace {

// Checks the options that the schema bounds too (inherited or hand-built nodes skip it),
// before any kernel is resolved.
void check_options(const nlohmann::json& options) {
  check_range("lr", number(options, "lr"), 0, std::nullopt, "3e-4");
  check_range("beta1", number(options, "beta1"), 0, 1, "0.9");
  check_range("beta2", number(options, "beta2"), 0, 1, "0.999 (0.95 for large models)");
  double eps = number(options, "eps");
  if (!(eps > 0))
    bad_option("eps", "must be > 0, got " + nlohmann::json(eps).dump() + ": use e.g. 1e-8");
  check_range("weight_decay", number(options, "weight_decay"), 0, std::nullopt, "0.01 or 0.1");
}

}  // namespace

AdamW::AdamW(const nlohmann::json& options, IBuildContext& ctx) {
  check_options(options);
  beta1_ = static_cast<float>(number(options, "beta1"));
  beta2_ = static_cast<float>(number(options, "beta2"));
  eps_ = static_cast<float>(number(options, "eps"));
  kernels_ = StepKernels(*ctx.host(), ops::kAdamWStep, options);
}

const char* AdamW::state_name(int32_t index) const noexcept {
  switch (index) {
    case 0:
      return "exp_avg";
    case 1:
      return "exp_avg_sq";
    default:
      return nullptr;
  }
}

Status AdamW::update(const OptimizerStep* hp, bool decay, TensorView* master,
                     const TensorView* grad, TensorView* states, void* stream) noexcept {
  return guard([&] {
    check_step(hp, "adamw");
    kernels_.check(master, grad, states, 2);
    ops::AdamWAttrs attrs{};
    attrs.lr = static_cast<float>(hp->lr);
    attrs.beta1 = beta1_;
    attrs.beta2 = beta2_;
    attrs.eps = eps_;
    attrs.weight_decay = decay ? static_cast<float>(hp->weight_decay) : 0.f;
    attrs.grad_scale = static_cast<float>(hp->grad_scale);
    attrs.step = hp->step;
    // outputs: master, exp_avg, exp_avg_sq, param (empty: the core casts master itself)
    kernels_.for_grad(grad->dtype)({*grad}, {*master, states[0], states[1], empty_view()}, attrs,
                                   stream);
  });
}

}  // namespace loom::optim
