#include "tests/plugins/transformer/module_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/schema/schema.h"

namespace loom::testing {

std::vector<std::string> transformer_plugins() {
  return {"kernels/cpu", "plugins/transformer", "plugins/fused_attention"};
}

namespace {

// Validates a component node like the spec loader, filling defaults (children included).
void resolve(const core::Catalog& catalog, const std::string& kind, nlohmann::json& node,
             const std::string& pointer) {
  core::SchemaHooks hooks;
  hooks.component = [&](const std::string& k, nlohmann::json& value, const std::string& p) {
    resolve(catalog, k, value, p);
  };
  std::string impl = node.at("impl").get<std::string>();
  const core::ManifestComponent* component = catalog.component(kind, impl);
  if (component == nullptr) throw std::runtime_error("no component " + kind + " " + impl);
  node.erase("impl");
  core::validate(component->options, node, pointer, hooks);
  node["impl"] = impl;
}

}  // namespace

nlohmann::json resolved(ModuleHarness& h, InterfaceInfo kind, nlohmann::json node) {
  resolve(h.plugins().catalog(), kind.kind, node, "/test");
  return node;
}

IModule& build_resolved(ModuleHarness& h, InterfaceInfo kind, nlohmann::json node,
                        const nlohmann::json& inherited, IFp8Recipe* fp8) {
  return h.build(kind, resolved(h, kind, std::move(node)), inherited, fp8);
}

void randomize_params(ModuleHarness& h, uint64_t seed, float scale) {
  for (core::Parameter& p : h.params().all()) {
    h.fill_random(p.value, seed++, scale);
    if (p.info.init == ParamInit::kOnes) {
      std::vector<float> v = h.values(p.value);
      for (float& x : v) x += 1.f;
      h.set_values(p.value, v);
    }
  }
}

std::vector<TensorView> ModuleCheck::forward(IForwardContext& ctx) {
  std::vector<TensorView> outputs(static_cast<size_t>(call_.num_outputs), TensorView{});
  throw_if_error(m_.forward(&ctx, call_.inputs.data(), static_cast<int32_t>(call_.inputs.size()),
                            outputs.data(), call_.num_outputs),
                 "forward");
  return outputs;
}

double ModuleCheck::weigh(const std::vector<TensorView>& outputs, Result* result) {
  for (size_t o = weights_.size(); o < outputs.size(); ++o) {  // made once, on first use
    const TensorView& out = outputs[o];
    std::vector<int64_t> shape(out.shape, out.shape + out.ndim);
    TensorView w = h_.tensor(DType::kF32, shape);
    if (out.data == nullptr) {
      w = TensorView{};
    } else if (numel(out) == 1) {
      h_.set_values(w, {1.f});
    } else {
      h_.fill_random(w, 1000 + o);
    }
    weights_.push_back(w);
  }
  double total = 0;
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (outputs[o].data == nullptr) {
      if (result) result->outputs.emplace_back();
      continue;
    }
    std::vector<float> v = h_.values(outputs[o]), w = h_.values(weights_[o]);
    for (size_t i = 0; i < v.size(); ++i) total += static_cast<double>(v[i]) * w[i];
    if (result) result->outputs.push_back(std::move(v));
  }
  return total;
}

Result ModuleCheck::run() {
  Result r;
  h_.params().zero_grads();
  core::ForwardContext& ctx = h_.new_context(call_.training, call_.policy);
  if (call_.loss_grad_in_forward != 0) {
    if (weights_.empty()) {
      TensorView w = h_.tensor(DType::kF32, {});
      h_.set_values(w, {call_.loss_grad_in_forward});
      weights_.push_back(w);
    }
    ctx.set_loss_grad(weights_[0]);
  }
  std::vector<TensorView> outputs = forward(ctx);
  r.objective = weigh(outputs, &r);
  std::vector<TensorView> grad_inputs(static_cast<size_t>(call_.num_grad_inputs), TensorView{});
  throw_if_error(m_.backward(&ctx, weights_.data(), static_cast<int32_t>(weights_.size()),
                             grad_inputs.data(), call_.num_grad_inputs),
                 "backward");
  for (size_t i = 0; i < call_.inputs.size(); ++i) {
    bool want = i < call_.differentiable.size() && call_.differentiable[i];
    if (!want) {
      r.input_grads.emplace_back();
      continue;
    }
    EXPECT_LT(i, grad_inputs.size());
    EXPECT_NE(grad_inputs[i].data, nullptr) << "no gradient for input " << i;
    r.input_grads.push_back(h_.values(grad_inputs[i]));
  }
  for (core::Parameter& p : h_.params().all()) r.param_grads[p.name] = h_.values(p.grad);
  return r;
}

double ModuleCheck::objective() {
  IForwardContext& ctx = h_.new_context(call_.training, call_.policy);
  return weigh(forward(ctx), nullptr);
}

void ModuleCheck::compare(const std::string& name, float* data, int64_t n,
                          const std::vector<float>& analytic, double eps, double tol, int samples) {
  ASSERT_EQ(static_cast<int64_t>(analytic.size()), n) << name;
  double scale = 0;
  for (float g : analytic) scale = std::max(scale, std::fabs(static_cast<double>(g)));
  std::set<int64_t> picks;
  for (int64_t k = 0; k < samples && k < n; ++k) picks.insert((k * 7919 + n / 3) % n);
  picks.insert(n - 1);
  for (int64_t i : picks) {
    float saved = data[i];
    data[i] = saved + static_cast<float>(eps);
    double plus = objective();
    data[i] = saved - static_cast<float>(eps);
    double minus = objective();
    data[i] = saved;
    double numeric = (plus - minus) / (2 * eps);
    double a = analytic[static_cast<size_t>(i)];
    EXPECT_LE(std::fabs(numeric - a), tol * (std::fabs(a) + 0.1 * scale) + 1e-4)
        << name << "[" << i << "]: finite difference " << numeric << ", backward " << a
        << " (largest gradient of the tensor " << scale << ")";
  }
}

void ModuleCheck::check_gradients(double eps, double tol, int samples) {
  Result r = run();
  for (size_t i = 0; i < call_.inputs.size(); ++i) {
    if (r.input_grads[i].empty()) continue;
    TensorView& x = call_.inputs[i];
    ASSERT_EQ(x.dtype, DType::kF32);
    compare("input " + std::to_string(i), static_cast<float*>(x.data), numel(x), r.input_grads[i],
            eps, tol, samples);
  }
  for (core::Parameter& p : h_.params().all()) {
    ASSERT_EQ(p.value.dtype, DType::kF32);
    compare(p.name, static_cast<float*>(p.value.data), p.numel(), r.param_grads[p.name], eps, tol,
            samples);
  }
}

double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double scale = 1e-6, diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return diff / scale;
}

void expect_same_grads(const Result& a, const Result& b, double tol, const std::string& what) {
  ASSERT_EQ(a.input_grads.size(), b.input_grads.size());
  for (size_t i = 0; i < a.input_grads.size(); ++i)
    EXPECT_LE(relative_diff(a.input_grads[i], b.input_grads[i]), tol) << what << ": input " << i;
  ASSERT_EQ(a.param_grads.size(), b.param_grads.size());
  for (const auto& [name, grad] : a.param_grads)
    EXPECT_LE(relative_diff(grad, b.param_grads.at(name)), tol) << what << ": " << name;
}

}  // namespace loom::testing
