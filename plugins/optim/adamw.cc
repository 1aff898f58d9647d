#include "plugins/optim/adamw.h"

#include <loom/cpp/tensor.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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

// A moment's dtype option: "f32" (absent) or "bf16".
DType moment_dtype(const nlohmann::json& options, const char* name) {
  const std::string value = string_or(options, name, "f32");
  if (value == "f32") return DType::kF32;
  if (value == "bf16") return DType::kBF16;
  bad_option(name, "must be \"f32\" or \"bf16\", got \"" + value +
                       "\" (Megatron's fp16 and fp8 moments need a scale per tensor, which "
                       "loom's AdamW does not keep)");
}

}  // namespace

AdamW::AdamW(const nlohmann::json& options, IBuildContext& ctx) : hyper_(hyper_of(options)) {
  check_options(options);
  beta1_ = static_cast<float>(number(options, "beta1"));
  beta2_ = static_cast<float>(number(options, "beta2"));
  eps_ = static_cast<float>(number(options, "eps"));
  state_dtypes_ = {moment_dtype(options, "exp_avg_dtype"),
                   moment_dtype(options, "exp_avg_sq_dtype")};
  kernels_ = StepKernels(*ctx.host(), ops::kAdamWStep, options);
  multi_ = StepKernels(*ctx.host(), ops::kAdamWStepMulti, options, /*optional=*/true);
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

DType AdamW::state_dtype(int32_t index) const noexcept {
  return index >= 0 && index < 2 ? state_dtypes_[static_cast<size_t>(index)] : DType::kInvalid;
}

ops::AdamWAttrs AdamW::attrs(const OptimizerStep& hp, bool decay) const {
  ops::AdamWAttrs a{};
  a.lr = static_cast<float>(hp.lr);
  a.beta1 = beta1_;
  a.beta2 = beta2_;
  a.eps = eps_;
  a.weight_decay = decay ? static_cast<float>(hp.weight_decay) : 0.f;
  a.grad_scale = static_cast<float>(hp.grad_scale);
  a.step = hp.step;
  return a;
}

Status AdamW::update(const OptimizerStep* hp, bool decay, TensorView* master,
                     const TensorView* grad, TensorView* states, void* stream) noexcept {
  return guard([&] {
    check_step(hp, "adamw");
    kernels_.check(master, grad, states, state_dtypes_);
    // outputs: master, exp_avg, exp_avg_sq, param (empty: the core casts master itself)
    run_step(kernels_.for_grad(grad->dtype), *grad, step_scalars(hp, kernels_.device(), "adamw"),
             {*master, states[0], states[1], empty_view()}, attrs(*hp, decay), stream);
  });
}

Status AdamW::update_many(const OptimizerStep* hp, int32_t count, const OptimizerShard* shards,
                          void* stream) noexcept {
  return guard([&] {
    check_step(hp, "adamw");
    const TensorView* scalars = step_scalars(hp, kernels_.device(), "adamw");
    ShardArray all(shards, count, "adamw");
    for (int32_t i = 0; i < all.size(); ++i) kernels_.check_shard(all[i], i, state_dtypes_);
    for (DType dtype : kernels_.grad_dtypes()) {
      std::vector<TensorView> grads, outs;  // (K) and (4K): adamw_step_multi's views
      std::vector<float> decay;
      for (int32_t i = 0; i < all.size(); ++i) {
        const OptimizerShard& s = all[i];
        if (s.grad.dtype != dtype) continue;
        grads.push_back(s.grad);
        outs.insert(outs.end(), {s.master, s.states[0], s.states[1], s.param});
        decay.push_back(attrs(*hp, s.decay != 0).weight_decay);
      }
      if (grads.empty()) continue;
      if (scalars != nullptr) grads.push_back(*scalars);  // the op's last input
      const int32_t shards_here = static_cast<int32_t>(decay.size());
      const Kernel& single = kernels_.for_grad(dtype);
      const Kernel* multi = multi_.find(dtype);
      if (multi != nullptr && std::strcmp(multi->name(), single.name()) == 0) {
        ops::AdamWAttrs a = attrs(*hp, true);
        ops::AdamWMultiAttrs m{a.lr,         a.beta1,     a.beta2, a.eps,
                               a.grad_scale, shards_here, a.step,  decay.data()};
        multi->run(grads, outs, m, stream);
      } else {
        for (int32_t k = 0; k < shards_here; ++k) {
          ops::AdamWAttrs a = attrs(*hp, true);
          a.weight_decay = decay[k];
          run_step(single, grads[k], scalars,
                   {outs[4 * k], outs[4 * k + 1], outs[4 * k + 2], outs[4 * k + 3]}, a, stream);
        }
      }
    }
  });
}

}  // namespace loom::optim
