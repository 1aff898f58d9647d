// The optim plugin's optimizers, loaded through the core with the CPU kernel library that
// serves adamw_step / sgd_step, against double-precision references written from
// torch.optim.AdamW and torch.optim.SGD, over several steps with a changing lr; and every
// bad option or bad update call refused with kInvalidArgument naming the culprit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "loom/cpp/half.h"
#include "loom/cpp/tensor.h"
#include "tests/plugins/optim/optim_env.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr int64_t kN = 37;  // not a multiple of any SIMD width
constexpr int kSteps = 5;
const double kLr[kSteps] = {1e-2, 3e-2, 2e-2, 5e-3, 1e-2};  // as a schedule would hand them

// One parameter shard: master weights, a gradient per step, state tensors.
struct Shard {
  std::vector<float> master;
  std::vector<std::vector<float>> grads;  // [kSteps] (kN)
  std::vector<std::vector<float>> states;

  explicit Shard(int32_t state_count, uint32_t seed = 7) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> w(-1.f, 1.f);
    std::normal_distribution<float> g(0.f, 1.f);
    for (int64_t i = 0; i < kN; ++i) master.push_back(w(rng));
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> grad;
      // Magnitudes from 1e-4 to 1e1, so eps and the bias corrections both matter.
      for (int64_t i = 0; i < kN; ++i) grad.push_back(g(rng) * std::pow(10.f, float(i % 6) - 4));
      grads.push_back(grad);
    }
    states.assign(state_count, std::vector<float>(kN, 0.f));
  }
};

// Status to (code, message).
std::string failure(Status status, Code* code) {
  *code = status.code;
  return status.code == Code::kOk ? "" : take_message(&status);
}

class OptimizerTest : public ::testing::Test {
 protected:
  OptimEnv env_{true};

  static IOptimizer& optimizer(const ObjectPtr& object) {
    auto* o = interface_cast<IOptimizer>(object.get());
    EXPECT_NE(o, nullptr);
    return *o;
  }

  // Runs kSteps updates of `opt` on `shard` with kLr, weight decay `wd`, `decay` and
  // `grad_scale`, gradients in `grad_dtype` (f32, or bf16 after rounding them).
  static void run(IOptimizer& opt, Shard& shard, double wd, bool decay, double grad_scale,
                  DType grad_dtype = DType::kF32) {
    for (int t = 0; t < kSteps; ++t) {
      OptimizerStep hp{sizeof(OptimizerStep), t + 1, kLr[t], wd, grad_scale, {}};
      TensorView master = make_view(shard.master.data(), DType::kF32, {kN});
      std::vector<uint16_t> bf16(kN);
      TensorView grad = make_view(shard.grads[t].data(), DType::kF32, {kN});
      if (grad_dtype == DType::kBF16) {
        for (int64_t i = 0; i < kN; ++i) bf16[i] = f32_to_bf16(shard.grads[t][i]);
        grad = make_view(bf16.data(), DType::kBF16, {kN});
      }
      std::vector<TensorView> states;
      for (auto& s : shard.states) states.push_back(make_view(s.data(), DType::kF32, {kN}));
      Code code = Code::kOk;
      std::string message =
          failure(opt.update(&hp, decay, &master, &grad, states.data(), nullptr), &code);
      ASSERT_EQ(code, Code::kOk) << message;
    }
  }

  static void expect_near(const std::vector<float>& got, const std::vector<double>& want,
                          const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-6 + 2e-5 * std::abs(want[i])) << what << "[" << i << "]";
  }
};

// torch.optim.AdamW's update, in double: decay the weights first (decoupled), then the Adam
// step with bias-corrected moments.
struct AdamWRef {
  double beta1, beta2, eps;
  std::vector<double> w, m, v;

  void run(const Shard& shard, double wd, bool decay, double grad_scale, bool bf16_grads) {
    for (int t = 1; t <= kSteps; ++t) {
      double lr = kLr[t - 1];
      double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
      for (int64_t i = 0; i < kN; ++i) {
        float raw = shard.grads[t - 1][i];
        double g = (bf16_grads ? bf16_to_f32(f32_to_bf16(raw)) : raw) * grad_scale;
        if (decay) w[i] *= 1 - lr * wd;
        m[i] = beta1 * m[i] + (1 - beta1) * g;
        v[i] = beta2 * v[i] + (1 - beta2) * g * g;
        w[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
      }
    }
  }
};

TEST_F(OptimizerTest, AdamWMatchesTheReferenceOverSeveralSteps) {
  struct Case {
    json node;
    double beta1, beta2, eps;
    bool decay;
    double grad_scale;
  };
  // weight_decay 0.1 comes with every step (OptimizerStep), as the core hands it down.
  std::vector<Case> cases = {
      {{{"impl", "adamw"}}, 0.9, 0.999, 1e-8, true, 1.0},
      {{{"impl", "adamw"}, {"beta1", 0.8}, {"beta2", 0.95}, {"eps", 1e-3}},
       0.8,
       0.95,
       1e-3,
       false,
       0.5},
      {{{"impl", "adamw"}, {"weight_decay", 0.1}}, 0.9, 0.999, 1e-8, true, 0.25},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.node.dump() + (c.decay ? " decay" : " no decay") +
                 " grad_scale=" + std::to_string(c.grad_scale));
    ObjectPtr object = env_.build("optimizer", c.node);
    IOptimizer& opt = optimizer(object);
    ASSERT_EQ(opt.state_count(), 2);
    EXPECT_STREQ(opt.state_name(0), "exp_avg");
    EXPECT_STREQ(opt.state_name(1), "exp_avg_sq");
    Shard shard(2);
    AdamWRef ref{c.beta1,
                 c.beta2,
                 c.eps,
                 {shard.master.begin(), shard.master.end()},
                 std::vector<double>(kN),
                 std::vector<double>(kN)};
    run(opt, shard, 0.1, c.decay, c.grad_scale);
    ref.run(shard, 0.1, c.decay, c.grad_scale, false);
    expect_near(shard.master, ref.w, "master");
    expect_near(shard.states[0], ref.m, "exp_avg");
    expect_near(shard.states[1], ref.v, "exp_avg_sq");
  }
}

TEST_F(OptimizerTest, AdamWTakesGradientsInTheParameterDtype) {
  ObjectPtr object = env_.build("optimizer", {{"impl", "adamw"}}, {{"params_dtype", "bf16"}});
  Shard shard(2);
  AdamWRef ref{0.9,
               0.999,
               1e-8,
               {shard.master.begin(), shard.master.end()},
               std::vector<double>(kN),
               std::vector<double>(kN)};
  run(optimizer(object), shard, 0.01, true, 1.0, DType::kBF16);
  ref.run(shard, 0.01, true, 1.0, true);
  expect_near(shard.master, ref.w, "master");
  expect_near(shard.states[1], ref.v, "exp_avg_sq");
}

// torch.optim.SGD's update (dampening 0), in double.
struct SgdRef {
  double momentum;
  bool nesterov;
  std::vector<double> w, buf;

  void run(const Shard& shard, double wd, bool decay, double grad_scale) {
    for (int t = 1; t <= kSteps; ++t) {
      for (int64_t i = 0; i < kN; ++i) {
        double g = double(shard.grads[t - 1][i]) * grad_scale;
        if (decay) g += wd * w[i];
        if (momentum > 0) {
          buf[i] = t == 1 ? g : momentum * buf[i] + g;
          g = nesterov ? g + momentum * buf[i] : buf[i];
        }
        w[i] -= kLr[t - 1] * g;
      }
    }
  }
};

TEST_F(OptimizerTest, SgdMatchesTheReferenceWithAndWithoutNesterovMomentum) {
  struct Case {
    json node;
    double momentum;
    bool nesterov, decay;
    double grad_scale;
  };
  std::vector<Case> cases = {
      {{{"impl", "sgd"}}, 0.9, false, true, 1.0},
      {{{"impl", "sgd"}, {"momentum", 0.5}, {"nesterov", true}}, 0.5, true, true, 2.0},
      {{{"impl", "sgd"}, {"nesterov", true}}, 0.9, true, false, 0.5},
      {{{"impl", "sgd"}, {"momentum", 0.0}}, 0.0, false, true, 1.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.node.dump() + (c.decay ? " decay" : " no decay"));
    ObjectPtr object = env_.build("optimizer", c.node);
    IOptimizer& opt = optimizer(object);
    int32_t count = c.momentum > 0 ? 1 : 0;
    ASSERT_EQ(opt.state_count(), count);
    if (count == 1) {
      EXPECT_STREQ(opt.state_name(0), "momentum_buffer");
    }
    Shard shard(count);
    // The buffer's contents before step 1 do not matter: step 1 sets it to the gradient.
    for (auto& s : shard.states) s.assign(kN, 123.f);
    SgdRef ref{c.momentum,
               c.nesterov,
               {shard.master.begin(), shard.master.end()},
               std::vector<double>(kN)};
    run(opt, shard, 0.05, c.decay, c.grad_scale);
    ref.run(shard, 0.05, c.decay, c.grad_scale);
    expect_near(shard.master, ref.w, "master");
    if (count == 1) expect_near(shard.states[0], ref.buf, "momentum_buffer");
  }
}

class OptimizerErrorTest : public OptimizerTest {
 protected:
  std::string build_error(const json& node, const json& inherited = json::object(),
                          Code want = Code::kInvalidArgument) {
    Code code = Code::kOk;
    std::string message = error_of([&] { env_.build("optimizer", node, inherited); }, &code);
    EXPECT_EQ(code, want) << message;
    return message;
  }
  std::string unchecked_error(const json& node) {
    Code code = Code::kOk;
    std::string message = error_of([&] { env_.build_unchecked("optimizer", node); }, &code);
    EXPECT_EQ(code, Code::kInvalidArgument) << message;
    return message;
  }
};

TEST_F(OptimizerErrorTest, BadOptionsNameTheOptionAndTheFix) {
  // The manifest's bounds, checked by the core before anything is built.
  EXPECT_THAT(build_error({{"impl", "adamw"}, {"beta1", 1.0}}), HasSubstr("/optimizer/beta1"));
  EXPECT_THAT(build_error({{"impl", "adamw"}, {"beta2", -0.1}}), HasSubstr("/optimizer/beta2"));
  EXPECT_THAT(build_error({{"impl", "adamw"}, {"eps", 0.0}}), HasSubstr("/optimizer/eps"));
  EXPECT_THAT(build_error({{"impl", "adamw"}, {"lr", -1e-3}}), HasSubstr("/optimizer/lr"));
  EXPECT_THAT(build_error({{"impl", "sgd"}, {"momentum", 1.0}}), HasSubstr("/optimizer/momentum"));
  // The plugin's own checks, for nodes that skipped the schema.
  json adamw = {{"impl", "adamw"}, {"lr", 1e-3},  {"beta1", 0.9},
                {"beta2", 0.999},  {"eps", 1e-8}, {"weight_decay", 0.01}};
  json bad = adamw;
  bad["beta1"] = 1.5;
  EXPECT_THAT(unchecked_error(bad),
              HasSubstr("spec /optimizer: option 'beta1' must be in [0.0, 1.0), got 1.5: use e.g. "
                        "0.9"));
  bad = adamw;
  bad["lr"] = -1.0;
  EXPECT_THAT(unchecked_error(bad), HasSubstr("option 'lr' must be >= 0.0, got -1.0"));
  bad = adamw;
  bad.erase("eps");
  EXPECT_THAT(unchecked_error(bad), HasSubstr("option 'eps' is missing"));
  bad = adamw;
  bad["weight_decay"] = -0.1;
  EXPECT_THAT(unchecked_error(bad), HasSubstr("option 'weight_decay' must be >= 0.0"));
  // Nesterov without momentum, as PyTorch refuses it.
  EXPECT_THAT(build_error({{"impl", "sgd"}, {"momentum", 0.0}, {"nesterov", true}}),
              HasSubstr("option 'nesterov' needs momentum > 0"));
  // What the core hands down.
  EXPECT_THAT(build_error({{"impl", "adamw"}}, {{"params_dtype", "f8"}}),
              HasSubstr("option 'params_dtype' must be \"f32\", \"bf16\" or \"f16\""));
  EXPECT_THAT(build_error({{"impl", "sgd"}}, {{"device", "tpu"}}),
              HasSubstr("option 'device' must be \"cpu\" or \"cuda\""));
}

TEST_F(OptimizerErrorTest, NoKernelForTheDeviceNamesTheOp) {
  // Only kernels_cpu is loaded: no kernel serves adamw_step on CUDA.
  std::string message = error_of([&] {
    env_.build("optimizer", {{"impl", "adamw"}}, {{"device", "cuda"}});
  });
  EXPECT_THAT(message, HasSubstr("adamw_step"));
  EXPECT_THAT(message, HasSubstr("/optimizer"));
}

TEST_F(OptimizerErrorTest, BadUpdateCallsAreRefused) {
  ObjectPtr object = env_.build("optimizer", {{"impl", "adamw"}});
  IOptimizer& opt = optimizer(object);
  std::vector<float> w(kN, 1.f), g(kN, 1.f), m(kN), v(kN), short_grad(kN - 1);
  std::vector<uint16_t> half(kN);
  TensorView master = make_view(w.data(), DType::kF32, {kN});
  TensorView grad = make_view(g.data(), DType::kF32, {kN});
  TensorView states[2] = {make_view(m.data(), DType::kF32, {kN}),
                          make_view(v.data(), DType::kF32, {kN})};
  OptimizerStep hp{sizeof(OptimizerStep), 1, 1e-3, 0.0, 1.0, {}};
  Code code = Code::kOk;

  OptimizerStep step0 = hp;
  step0.step = 0;
  EXPECT_THAT(failure(opt.update(&step0, true, &master, &grad, states, nullptr), &code),
              HasSubstr("steps are 1-based"));
  EXPECT_EQ(code, Code::kInvalidArgument);

  OptimizerStep negative = hp;
  negative.lr = -1;
  EXPECT_THAT(failure(opt.update(&negative, true, &master, &grad, states, nullptr), &code),
              HasSubstr("lr must be finite and >= 0"));

  TensorView short_view = make_view(short_grad.data(), DType::kF32, {kN - 1});
  EXPECT_THAT(failure(opt.update(&hp, true, &master, &short_view, states, nullptr), &code),
              HasSubstr("grad has 36 elements, master 37"));
  EXPECT_EQ(code, Code::kInvalidArgument);

  TensorView bf16_grad = make_view(half.data(), DType::kBF16, {kN});
  EXPECT_THAT(failure(opt.update(&hp, true, &master, &bf16_grad, states, nullptr), &code),
              HasSubstr("gradient dtype bf16 is neither f32 nor the parameter dtype f32"));
  EXPECT_EQ(code, Code::kInvalidArgument);

  TensorView f16_master = make_view(half.data(), DType::kF16, {kN});
  EXPECT_THAT(failure(opt.update(&hp, true, &f16_master, &grad, states, nullptr), &code),
              HasSubstr("master weights must be f32"));
  EXPECT_EQ(code, Code::kInvalidArgument);

  // Nothing was written by the refused calls.
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(w[i], 1.f);
}

}  // namespace
}  // namespace loom::testing
