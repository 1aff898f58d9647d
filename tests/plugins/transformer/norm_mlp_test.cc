// LayerNorm, RMSNorm and the MLP (gelu, gelu_tanh, swiglu; with and without biases):
// backward against central finite differences, parameter layout, bad options.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/util/errors.h"
#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

TensorView random_input(ModuleHarness& h, std::vector<int64_t> shape, uint64_t seed) {
  TensorView x = h.tensor(DType::kF32, shape);
  h.fill_random(x, seed);
  return x;
}

class NormTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NormTest, BackwardMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& norm = build_resolved(h, kinds::kNorm, {{"impl", GetParam()}}, {{"hidden_size", 8}});
  randomize_params(h, 5, 0.5f);
  ModuleCheck check(h, norm, {{random_input(h, {2, 3, 8}, 1)}, {true}});
  check.check_gradients();
}

// Norm 1.2's residual: forward (x, r) -> (y, z = x + r), backward (dy, dz) -> dx. The
// harness weighs both outputs, so the objective's gradient by x is the norm's plus dz: central
// differences of x and of the parameters check the fused forward and backward together.
TEST_P(NormTest, ResidualFusedIntoTheNormMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& norm = build_resolved(h, kinds::kNorm, {{"impl", GetParam()}}, {{"hidden_size", 8}});
  EXPECT_EQ(norm.interface_info().minor, 2u);
  randomize_params(h, 5, 0.5f);
  Call call{{random_input(h, {2, 3, 8}, 1), random_input(h, {2, 3, 8}, 3)}, {true, false}};
  call.num_outputs = 2;
  ModuleCheck check(h, norm, call);
  check.check_gradients();
}

// The same call on the fused kernels (add_layernorm_* / add_rmsnorm_*) and with them pinned to
// "none" (the norm then runs add and the plain norm): z is x + r exactly, and outputs and
// gradients agree bit for bit, since the CPU's fused kernels run that sequence.
TEST_P(NormTest, ResidualOnTheFusedKernelsEqualsTheUnfusedOps) {
  const std::string fwd = "add_" + GetParam() + "_fwd", bwd = "add_" + GetParam() + "_bwd";
  Result results[2];
  for (int fused = 0; fused < 2; ++fused) {
    ModuleHarness h(transformer_plugins());
    if (!fused) h.plugins().host().set_pins({{fwd, "none"}, {bwd, "none"}});
    IModule& norm = build_resolved(h, kinds::kNorm, {{"impl", GetParam()}}, {{"hidden_size", 8}});
    randomize_params(h, 5, 0.5f);
    TensorView x = random_input(h, {2, 3, 8}, 1), r = random_input(h, {2, 3, 8}, 3);
    Call call{{x, r}, {true, false}};
    call.num_outputs = 2;
    ModuleCheck check(h, norm, call);
    results[fused] = check.run();
    std::vector<float> xv = h.values(x), rv = h.values(r);
    for (size_t i = 0; i < xv.size(); ++i)
      ASSERT_EQ(results[fused].outputs[1][i], xv[i] + rv[i]) << "z[" << i << "]";
    int resolved = 0;
    for (const auto& res : h.plugins().host().resolutions())
      resolved += res.op == fwd || res.op == bwd;
    EXPECT_EQ(resolved, fused ? 2 : 0) << "fused " << fused;
  }
  EXPECT_EQ(results[0].outputs, results[1].outputs);
  expect_same_grads(results[1], results[0], 0.0, GetParam());
}

TEST_P(NormTest, AResidualNeedsTheSumsOutput) {
  ModuleHarness h(transformer_plugins());
  IModule& norm = build_resolved(h, kinds::kNorm, {{"impl", GetParam()}}, {{"hidden_size", 8}});
  ModuleCheck check(h, norm,
                    {{random_input(h, {2, 3, 8}, 1), random_input(h, {2, 3, 8}, 3)}, {true}});
  try {
    check.run();
    ADD_FAILURE() << "a residual with one output ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "a residual (input [1]) gives the sum x + r as output [1]; ask for 2 outputs"),
              std::string::npos)
        << e.what();
  }
}

TEST_P(NormTest, DeclaresWeightsWithoutDecay) {
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kNorm, {{"impl", GetParam()}, {"zero_centered_gamma", true}},
                 {{"hidden_size", 8}});
  auto& all = h.params().all();
  ASSERT_EQ(all.size(), GetParam() == "layernorm" ? 2u : 1u);
  EXPECT_EQ(all[0].name, "weight");
  EXPECT_EQ(all[0].info.init, ParamInit::kZeros);  // zero-centred gamma
  for (auto& p : all) {
    EXPECT_EQ(p.info.shape[0], 8);
    EXPECT_TRUE(p.info.flags & kParamNoWeightDecay) << p.name;
  }
}

TEST_P(NormTest, RefusesAMissingHiddenSize) {
  ModuleHarness h(transformer_plugins());
  try {
    build_resolved(h, kinds::kNorm, {{"impl", GetParam()}});
    FAIL() << "built without hidden_size";
  } catch (const core::SpecError& e) {
    EXPECT_EQ(e.pointer(), "/test/hidden_size");
    EXPECT_NE(e.problem().find("enclosing component"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Norms, NormTest, ::testing::Values("layernorm", "rmsnorm"));

struct MlpCase {
  std::string activation;
  bool bias;
};

class MlpTest : public ::testing::TestWithParam<MlpCase> {};

json mlp_inherited(bool bias) {
  return {{"hidden_size", 8},
          {"ffn_hidden_size", 6},
          {"add_bias_linear", bias},
          {"init_std", 0.02},
          {"num_layers", 2}};
}

TEST_P(MlpTest, BackwardMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& mlp =
      build_resolved(h, kinds::kMlp, {{"impl", "mlp"}, {"activation", GetParam().activation}},
                     mlp_inherited(GetParam().bias));
  randomize_params(h, 9, 0.4f);
  ModuleCheck check(h, mlp, {{random_input(h, {2, 3, 8}, 2)}, {true}});
  check.check_gradients();
}

TEST_P(MlpTest, DeclaresMegatronParameters) {
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kMlp, {{"impl", "mlp"}, {"activation", GetParam().activation}},
                 mlp_inherited(GetParam().bias));
  bool swiglu = GetParam().activation == "swiglu";
  core::Parameter* fc1 = h.params().find("linear_fc1.weight");
  core::Parameter* fc2 = h.params().find("linear_fc2.weight");
  ASSERT_TRUE(fc1 && fc2);
  // swiglu: (2, F, C), [gate; up], split over TP on F so that each rank keeps both halves.
  std::vector<int64_t> fc1_shape =
      swiglu ? std::vector<int64_t>{2, 6, 8} : std::vector<int64_t>{6, 8};
  EXPECT_EQ(std::vector<int64_t>(fc1->info.shape, fc1->info.shape + fc1->info.ndim), fc1_shape);
  EXPECT_EQ(fc1->info.tp_split_dim, swiglu ? 1 : 0);
  EXPECT_EQ(fc1->info.init, ParamInit::kNormal);
  EXPECT_FLOAT_EQ(fc1->info.init_std, 0.02f);
  EXPECT_EQ(fc2->info.shape[0], 8);
  EXPECT_EQ(fc2->info.shape[1], 6);
  EXPECT_EQ(fc2->info.tp_split_dim, 1);
  EXPECT_EQ(fc2->info.init, ParamInit::kScaledNormal);
  EXPECT_FLOAT_EQ(fc2->info.init_std, 0.01f);  // 0.02 / sqrt(2 * 2 layers)
  EXPECT_EQ(h.params().find("linear_fc1.bias") != nullptr, GetParam().bias);
  EXPECT_EQ(h.params().all().size(), GetParam().bias ? 4u : 2u);
}

// The fused path (gemm_epilogue: bias and GELU on fc1's GEMM, dGELU and fc1's bias gradient
// on fc2's input-gradient GEMM, fc2's bias and the weight gradients' bias sums on theirs) is
// the one a model takes where a kernel serves the op; the spec pin "none" turns it off. On the
// CPU, whose gemm_epilogue runs the unfused ops, both give the same outputs and gradients bit
// for bit: a fused site that read or wrote the wrong tensor would not.
TEST_P(MlpTest, FusedEpiloguesEqualTheUnfusedOps) {
  Result results[2];
  bool resolved[2] = {false, false};
  for (int fused = 0; fused < 2; ++fused) {
    ModuleHarness h(transformer_plugins());
    if (!fused) h.plugins().host().set_pins({{"gemm_epilogue", "none"}});
    IModule& mlp =
        build_resolved(h, kinds::kMlp, {{"impl", "mlp"}, {"activation", GetParam().activation}},
                       mlp_inherited(GetParam().bias));
    randomize_params(h, 9, 0.4f);
    ModuleCheck check(h, mlp, {{random_input(h, {2, 3, 8}, 2)}, {true}});
    results[fused] = check.run();
    for (const auto& r : h.plugins().host().resolutions())
      resolved[fused] = resolved[fused] || r.op == "gemm_epilogue";
  }
  EXPECT_FALSE(resolved[0]) << "the pin 'none' must keep the MLP on the unfused ops";
  EXPECT_TRUE(resolved[1]) << "kernels_cpu serves gemm_epilogue: the MLP must resolve it";
  EXPECT_EQ(results[0].outputs, results[1].outputs);
  expect_same_grads(results[1], results[0], 0.0, GetParam().activation);
  EXPECT_EQ(results[0].param_grads.size(), GetParam().bias ? 4u : 2u);
}

// LOOM_FC1_BIAS_GRAD moves a fused GELU MLP's fc1 bias gradient from fc1's weight-gradient
// GEMM (wgrad, the default) into the dgelu GEMM (dgelu): either way the gradients are the
// unfused ops', bit for bit (the CPU's epilogues sum as bias_grad does). A bad value names
// the variable and its values.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(MlpOptions, Fc1BiasGradientInEitherGemmEqualsTheUnfusedOps) {
  for (const char* activation : {"gelu", "gelu_tanh"}) {
    Result unfused, fused[2];
    const char* modes[2] = {"wgrad", "dgelu"};
    for (int run = 0; run < 3; ++run) {
      ScopedEnv env("LOOM_FC1_BIAS_GRAD", run == 0 ? "" : modes[run - 1]);
      ModuleHarness h(transformer_plugins());
      if (run == 0) h.plugins().host().set_pins({{"gemm_epilogue", "none"}});
      IModule& mlp = build_resolved(h, kinds::kMlp, {{"impl", "mlp"}, {"activation", activation}},
                                    mlp_inherited(true));
      randomize_params(h, 9, 0.4f);
      ModuleCheck check(h, mlp, {{random_input(h, {2, 3, 8}, 2)}, {true}});
      (run == 0 ? unfused : fused[run - 1]) = check.run();
    }
    for (int m = 0; m < 2; ++m) {
      SCOPED_TRACE(std::string(activation) + ", LOOM_FC1_BIAS_GRAD=" + modes[m]);
      EXPECT_EQ(fused[m].outputs, unfused.outputs);
      ASSERT_EQ(fused[m].param_grads.size(), 4u);
      expect_same_grads(fused[m], unfused, 0.0, activation);
    }
  }
}

// Building an MLP (with biases) in `h` fails with a message that contains `expected`.
void expect_mlp_refused(ModuleHarness& h, const std::string& expected) {
  try {
    build_resolved(h, kinds::kMlp, {{"impl", "mlp"}}, mlp_inherited(true));
    ADD_FAILURE() << "built an MLP; expected: " << expected;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(MlpOptions, ABadFc1BiasGradModeNamesTheVariable) {
  ScopedEnv env("LOOM_FC1_BIAS_GRAD", "gemm");
  ModuleHarness h(transformer_plugins());
  expect_mlp_refused(h, "LOOM_FC1_BIAS_GRAD='gemm' is not one of wgrad, dgelu");
}

INSTANTIATE_TEST_SUITE_P(Activations, MlpTest,
                         ::testing::Values(MlpCase{"gelu", true}, MlpCase{"gelu_tanh", true},
                                           MlpCase{"gelu_tanh", false}, MlpCase{"swiglu", false},
                                           MlpCase{"swiglu", true}),
                         [](const auto& info) {
                           return info.param.activation + (info.param.bias ? "_bias" : "");
                         });

// "none" on an op a module cannot do without: the build fails, naming the pin and the fix.
TEST(MlpOptions, APinToNoneOfARequiredOpNamesThePin) {
  ModuleHarness h(transformer_plugins());
  h.plugins().host().set_pins({{"gemm", "none"}});
  expect_mlp_refused(h, "spec /kernels/pin/gemm: pinned to 'none'");
}

TEST(MlpOptions, RefusesAnUnknownActivation) {
  ModuleHarness h(transformer_plugins());
  EXPECT_THROW(build_resolved(h, kinds::kMlp, {{"impl", "mlp"}, {"activation", "relu"}},
                              mlp_inherited(true)),
               core::SpecError);
}

}  // namespace
}  // namespace loom::testing
