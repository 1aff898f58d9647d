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

// exp_avg_dtype / exp_avg_sq_dtype "bf16" (Megatron's precision-aware optimizer): the states
// are bf16 (state_dtype), and each step is torch's AdamW from the stored moments, in double
// here, the master updated with the unrounded new moments and each bf16 moment then stored
// rounded to nearest (Transformer Engine's FusedAdam with bf16 moments: widen, f32 step,
// copy back). Checked step by step from the optimizer's own state before the step: the
// master to 2e-5, an f32 moment to 2e-5, a bf16 one within half a bf16 unit (2^-8 of its
// value; truncation, up to 2^-7, fails).
TEST_F(OptimizerTest, AdamWBf16MomentsAreTheUpdateWithMomentsRoundedEachStep) {
  for (int mix : {1, 2, 3}) {  // bf16: exp_avg, exp_avg_sq, both
    SCOPED_TRACE("mix " + std::to_string(mix));
    json node = {{"impl", "adamw"}, {"beta2", 0.95}};
    if (mix & 1) node["exp_avg_dtype"] = "bf16";
    if (mix & 2) node["exp_avg_sq_dtype"] = "bf16";
    ObjectPtr object = env_.build("optimizer", node);
    IOptimizer& opt = optimizer(object);
    ASSERT_TRUE(has_state_dtype(opt));
    EXPECT_EQ(opt.state_dtype(0), mix & 1 ? DType::kBF16 : DType::kF32);
    EXPECT_EQ(opt.state_dtype(1), mix & 2 ? DType::kBF16 : DType::kF32);
    EXPECT_EQ(opt.state_dtype(2), DType::kInvalid);
    Shard shard(2);
    std::vector<std::vector<uint16_t>> bf16(2, std::vector<uint16_t>(kN, 0));
    auto state = [&](int k, int64_t i) -> double {
      return opt.state_dtype(k) == DType::kBF16 ? bf16_to_f32(bf16[k][i]) : shard.states[k][i];
    };
    double worst_w = 0, worst_bf16 = 0;
    for (int t = 1; t <= kSteps; ++t) {
      std::vector<double> w0(shard.master.begin(), shard.master.end()), m0(kN), v0(kN);
      for (int64_t i = 0; i < kN; ++i) m0[i] = state(0, i), v0[i] = state(1, i);
      OptimizerStep hp{sizeof(OptimizerStep), t, kLr[t - 1], 0.1, 1.0, {}};
      TensorView master = make_view(shard.master.data(), DType::kF32, {kN});
      TensorView grad = make_view(shard.grads[t - 1].data(), DType::kF32, {kN});
      TensorView states[2];
      for (int k = 0; k < 2; ++k)
        states[k] = opt.state_dtype(k) == DType::kBF16
                        ? make_view(bf16[k].data(), DType::kBF16, {kN})
                        : make_view(shard.states[k].data(), DType::kF32, {kN});
      Code code = Code::kOk;
      std::string message = failure(opt.update(&hp, true, &master, &grad, states, nullptr), &code);
      ASSERT_EQ(code, Code::kOk) << message;
      const double lr = kLr[t - 1], bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.95, t);
      for (int64_t i = 0; i < kN; ++i) {
        const double g = shard.grads[t - 1][i];
        const double m = 0.9 * m0[i] + 0.1 * g, v = 0.95 * v0[i] + 0.05 * g * g;
        const double w = w0[i] * (1 - lr * 0.1) - (lr / bc1) * m / (std::sqrt(v / bc2) + 1e-8);
        ASSERT_NEAR(shard.master[i], w, 2e-6 + 2e-5 * std::abs(w))
            << "master " << i << " step " << t;
        worst_w = std::max(worst_w, std::abs(shard.master[i] - w) / (1e-3 + std::abs(w)));
        // The f32 arithmetic's error is relative to the terms' size (m's two terms may
        // cancel); the rounding's to the result's.
        const double terms[2] = {0.9 * std::abs(m0[i]) + 0.1 * std::abs(g),
                                 0.95 * v0[i] + 0.05 * g * g};
        for (auto [k, want] : {std::pair{0, m}, {1, v}}) {
          const double got = state(k, i);
          const bool low = opt.state_dtype(k) == DType::kBF16;
          const double half_unit = std::ldexp(1.0, -8);  // of |want|
          ASSERT_LE(std::abs(got - want), (low ? half_unit : 0) * std::abs(want) + 1e-6 * terms[k])
              << (k == 0 ? "exp_avg " : "exp_avg_sq ") << i << " step " << t;
          if (low && want != 0)
            worst_bf16 = std::max(worst_bf16, std::abs(got - want) / std::abs(want));
        }
      }
    }
    std::printf(
        "mix %d: master within %.3g relative, bf16 moments within %.4g of their value "
        "(half a unit: %.4g)\n",
        mix, worst_w, worst_bf16, std::ldexp(1.0, -8));
    // An f32 state where the optimizer said bf16 is refused, naming it.
    if (mix == 3) {
      OptimizerStep hp{sizeof(OptimizerStep), 1, 1e-3, 0.0, 1.0, {}};
      TensorView master = make_view(shard.master.data(), DType::kF32, {kN});
      TensorView grad = make_view(shard.grads[0].data(), DType::kF32, {kN});
      TensorView states[2] = {make_view(shard.states[0].data(), DType::kF32, {kN}),
                              make_view(bf16[1].data(), DType::kBF16, {kN})};
      Code code = Code::kOk;
      EXPECT_THAT(failure(opt.update(&hp, true, &master, &grad, states, nullptr), &code),
                  HasSubstr("state 0 must be bf16 with 37 elements on the master weights' "
                            "device (got f32 with 37)"));
      EXPECT_EQ(code, Code::kInvalidArgument);
    }
  }
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
  // Moments in bf16 or f32 only (Megatron's f16 and fp8 ones need a scale per tensor).
  EXPECT_THAT(build_error({{"impl", "adamw"}, {"exp_avg_dtype", "f16"}}),
              HasSubstr("/optimizer/exp_avg_dtype"));
  bad = adamw;
  bad["exp_avg_sq_dtype"] = "fp8";
  EXPECT_THAT(unchecked_error(bad),
              HasSubstr("option 'exp_avg_sq_dtype' must be \"f32\" or \"bf16\", got \"fp8\""));
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
