#include "plugins/optim/sgd.h"

#include <loom/cpp/tensor.h>

#include "plugins/optim/options.h"

namespace loom::optim {

Sgd::Sgd(const nlohmann::json& options, IBuildContext& ctx) : hyper_(hyper_of(options)) {
  check_range("lr", number(options, "lr"), 0, std::nullopt, "0.1");
  double momentum = number(options, "momentum");
  check_range("momentum", momentum, 0, 1, "0.9");
  check_range("weight_decay", number(options, "weight_decay"), 0, std::nullopt, "1e-4");
  nesterov_ = boolean(options, "nesterov");
  if (nesterov_ && momentum == 0)
    bad_option("nesterov", "needs momentum > 0: set momentum (e.g. 0.9) or nesterov to false");
  momentum_ = static_cast<float>(momentum);
  state_dtypes_.assign(static_cast<size_t>(state_count()), DType::kF32);
  kernels_ = StepKernels(*ctx.host(), ops::kSgdStep, options);
}

const char* Sgd::state_name(int32_t index) const noexcept {
  return index == 0 && momentum_ > 0 ? "momentum_buffer" : nullptr;
}

ops::SgdAttrs Sgd::attrs(const OptimizerStep& hp, bool decay) const {
  ops::SgdAttrs a{};
  a.lr = static_cast<float>(hp.lr);
  a.momentum = momentum_;
  a.weight_decay = decay ? static_cast<float>(hp.weight_decay) : 0.f;
  a.grad_scale = static_cast<float>(hp.grad_scale);
  a.nesterov = nesterov_ ? 1 : 0;
  a.step = hp.step;
  return a;
}

Status Sgd::update(const OptimizerStep* hp, bool decay, TensorView* master, const TensorView* grad,
                   TensorView* states, void* stream) noexcept {
  return guard([&] {
    check_step(hp, "sgd");
    int32_t count = state_count();
    kernels_.check(master, grad, states, state_dtypes_);
    // outputs: master, momentum buffer (empty without momentum), param (empty: the core casts)
    run_step(kernels_.for_grad(grad->dtype), *grad, step_scalars(hp, kernels_.device(), "sgd"),
             {*master, count > 0 ? states[0] : empty_view(), empty_view()}, attrs(*hp, decay),
             stream);
  });
}

Status Sgd::update_many(const OptimizerStep* hp, int32_t count, const OptimizerShard* shards,
                        void* stream) noexcept {
  return guard([&] {
    check_step(hp, "sgd");
    const TensorView* scalars = step_scalars(hp, kernels_.device(), "sgd");
    ShardArray all(shards, count, "sgd");
    const int32_t states = state_count();
    for (int32_t i = 0; i < all.size(); ++i) kernels_.check_shard(all[i], i, state_dtypes_);
    for (int32_t i = 0; i < all.size(); ++i) {
      const OptimizerShard& s = all[i];
      // outputs: master, momentum buffer (empty without momentum), param (or empty)
      run_step(kernels_.for_grad(s.grad.dtype), s.grad, scalars,
               {s.master, states > 0 ? s.states[0] : empty_view(), s.param},
               attrs(*hp, s.decay != 0), stream);
    }
  });
}

}  // namespace loom::optim
