// Helpers for the transformer module tests: build a component from a spec node with its
// schema defaults filled in (as the spec loader does), randomise parameters, and check a
// module's backward against central finite differences of a scalar objective
// L = sum_o <R_o, output_o> (R_o fixed random projections; 1 for a scalar output).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/kinds.h"
#include "tests/util/module_harness.h"

namespace loom::testing {

/// The plugin directories every test loads (runfiles).
std::vector<std::string> transformer_plugins();

/// `node` with its (and its children's) schema defaults filled in, as the spec loader does.
nlohmann::json resolved(ModuleHarness& h, InterfaceInfo kind, nlohmann::json node);

/// Builds `kind` from `node` after filling its (and its children's) schema defaults, with
/// the FP8 recipe `fp8` when not null.
IModule& build_resolved(ModuleHarness& h, InterfaceInfo kind, nlohmann::json node,
                        const nlohmann::json& inherited = nlohmann::json::object(),
                        IFp8Recipe* fp8 = nullptr);

/// Sets every parameter to normal(0, scale) values (plus 1 for norm weights, so that
/// norms stay near identity).
void randomize_params(ModuleHarness& h, uint64_t seed, float scale);

/// One way of calling a module.
struct Call {
  std::vector<TensorView> inputs;
  std::vector<bool> differentiable;  // per input: check its gradient
  int32_t num_outputs = 1;
  int32_t num_grad_inputs = 1;
  bool training = true;
  RecomputePolicy policy = RecomputePolicy::kNone;
  /// Nonzero: output 0 (a scalar loss) weighs this much in the objective, and the context
  /// holds that weight before the forward as the loss's gradient (IForwardContext::loss_grad),
  /// as the trainer does; backward then gets that same view.
  float loss_grad_in_forward = 0;
};

/// Outputs, analytic gradients and the objective of one forward + backward.
struct Result {
  double objective = 0;
  std::vector<std::vector<float>> outputs;
  std::vector<std::vector<float>> input_grads;  // empty for inputs without a gradient
  std::map<std::string, std::vector<float>> param_grads;
};

class ModuleCheck {
 public:
  ModuleCheck(ModuleHarness& h, IModule& module, Call call) : h_(h), m_(module), call_(call) {}
  /// Forward, objective and backward (parameter gradients zeroed first).
  Result run();
  /// Forward only, the objective (same random streams as run()).
  double objective();
  /// Central differences for every differentiable input and every parameter, on up to
  /// `samples` elements of each: |numeric - backward| <= tol * (|backward| + 0.1 * largest
  /// gradient of the tensor) + 1e-4 (f32 rounding of the objective). gtest failures name the
  /// tensor and element.
  void check_gradients(double eps = 1e-2, double tol = 5e-3, int samples = 10);
  Call& call() { return call_; }

 private:
  std::vector<TensorView> forward(IForwardContext& ctx);
  double weigh(const std::vector<TensorView>& outputs, Result* result);
  void compare(const std::string& name, float* data, int64_t n, const std::vector<float>& analytic,
               double eps, double tol, int samples);

  ModuleHarness& h_;
  IModule& m_;
  Call call_;
  std::vector<TensorView> weights_;  // R_o
};

/// Max |a - b| / max(max |b|, 1e-6) over two equally long vectors.
double relative_diff(const std::vector<float>& a, const std::vector<float>& b);

/// Expects every gradient (inputs and parameters) of `a` and `b` to agree within `tol`.
void expect_same_grads(const Result& a, const Result& b, double tol, const std::string& what);

}  // namespace loom::testing
