#include "plugins/optim/sgd.h"

#include <loom/cpp/tensor.h>

#include "plugins/optim/options.h"

namespace loom::optim {

Sgd::Sgd(const nlohmann::json& options, IBuildContext& ctx) {
  check_range("lr", number(options, "lr"), 0, std::nullopt, "0.1");
  double momentum = number(options, "momentum");
  check_range("momentum", momentum, 0, 1, "0.9");
  check_range("weight_decay", number(options, "weight_decay"), 0, std::nullopt, "1e-4");
  nesterov_ = boolean(options, "nesterov");
  if (nesterov_ && momentum == 0)
    bad_option("nesterov", "needs momentum > 0: set momentum (e.g. 0.9) or nesterov to false");
  momentum_ = static_cast<float>(momentum);
  kernels_ = StepKernels(*ctx.host(), ops::kSgdStep, options);
}

const char* Sgd::state_name(int32_t index) const noexcept {
  return index == 0 && momentum_ > 0 ? "momentum_buffer" : nullptr;
}

Status Sgd::update(const OptimizerStep* hp, bool decay, TensorView* master, const TensorView* grad,
                   TensorView* states, void* stream) noexcept {
  return guard([&] {
    check_step(hp, "sgd");
    int32_t count = state_count();
    kernels_.check(master, grad, states, count);
    ops::SgdAttrs attrs{};
    attrs.lr = static_cast<float>(hp->lr);
    attrs.momentum = momentum_;
    attrs.weight_decay = decay ? static_cast<float>(hp->weight_decay) : 0.f;
    attrs.grad_scale = static_cast<float>(hp->grad_scale);
    attrs.nesterov = nesterov_ ? 1 : 0;
    attrs.step = hp->step;
    // outputs: master, momentum buffer (empty without momentum), param (empty: the core casts)
    kernels_.for_grad(grad->dtype)(
        {*grad}, {*master, count > 0 ? states[0] : empty_view(), empty_view()}, attrs, stream);
  });
}

}  // namespace loom::optim
