// adamw_step and sgd_step: the reference against f64 updates written here over several
// steps, fast against reference over grad dtypes and odd sizes, the param cast.
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

class OptimTest : public ::testing::TestWithParam<DType> {};

TEST_P(OptimTest, AdamWReferenceMatchesF64OverSteps) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  const int64_t n = 37;
  Tensor w = Tensor::random(DType::kF32, {n}, rng), m = Tensor::filled(DType::kF32, {n}, 0);
  Tensor v = Tensor::filled(DType::kF32, {n}, 0), param(dt, {n});
  std::vector<double> ew = w.values(), em(n, 0.0), ev(n, 0.0);
  for (int64_t step = 1; step <= 5; ++step) {
    Tensor g = Tensor::random(dt, {n}, rng);
    ops::AdamWAttrs at{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step};
    run_ref(ops::kAdamWStep, dt, {&g}, {&w, &m, &v, &param}, &at);
    for (int64_t i = 0; i < n; ++i) {
      double gi = g.get(i) * 0.5;
      em[i] = 0.9 * em[i] + 0.1 * gi;
      ev[i] = 0.95 * ev[i] + 0.05 * gi * gi;
      double mh = em[i] / (1 - std::pow(0.9, step)), vh = ev[i] / (1 - std::pow(0.95, step));
      ew[i] -= 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * ew[i]);
    }
  }
  expect_close(w, ew, DType::kF32, "adamw master");
  expect_close(m, em, DType::kF32, "adamw exp_avg");
  expect_close(v, ev, DType::kF32, "adamw exp_avg_sq");
  expect_close(param, ew, dt, "adamw param cast");
}

TEST_P(OptimTest, SgdReferenceMatchesF64OverSteps) {
  std::mt19937 rng(2);
  DType dt = GetParam();
  const int64_t n = 19;
  for (float momentum : {0.0f, 0.9f})
    for (int nesterov : {0, 1}) {
      Tensor w = Tensor::random(DType::kF32, {n}, rng),
             buf = momentum != 0 ? Tensor::filled(DType::kF32, {n}, 7) : Tensor();
      Tensor param;
      std::vector<double> ew = w.values(), eb(n, 0.0);
      for (int64_t step = 1; step <= 4; ++step) {
        Tensor g = Tensor::random(dt, {n}, rng);
        ops::SgdAttrs at{0.05f, momentum, 0.01f, 2.0f, nesterov, step};
        run_ref(ops::kSgdStep, dt, {&g}, {&w, &buf, &param}, &at);
        for (int64_t i = 0; i < n; ++i) {
          double gi = g.get(i) * 2.0 + 0.01 * ew[i];
          eb[i] = step == 1 ? gi : momentum * eb[i] + gi;  // buf = g at step 1
          double update = momentum == 0 ? gi : (nesterov ? gi + momentum * eb[i] : eb[i]);
          ew[i] -= 0.05 * update;
        }
      }
      expect_close(w, ew, DType::kF32, "sgd master");
      if (momentum != 0) expect_close(buf, eb, DType::kF32, "sgd momentum buffer");
    }
}

TEST_P(OptimTest, FastMatchesReference) {
  std::mt19937 rng(3);
  DType dt = GetParam();
  for (int64_t n : {1, 7, 33, 4099}) {
    Tensor g = Tensor::random(dt, {n}, rng), w = Tensor::random(DType::kF32, {n}, rng);
    Tensor m = Tensor::random(DType::kF32, {n}, rng),
           v = Tensor::random(DType::kF32, {n}, rng, 0, 1);
    ops::AdamWAttrs aw{3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 7};
    expect_fast_matches_ref(ops::kAdamWStep, dt, {g}, {w, m, v, Tensor(dt, {n})}, &aw);
    expect_fast_matches_ref(ops::kAdamWStep, dt, {g}, {w, m, v, Tensor()}, &aw);
    for (int64_t step : {1, 3}) {
      ops::SgdAttrs sg{0.1f, 0.9f, 0.01f, 1.0f, static_cast<int32_t>(step == 3), step};
      expect_fast_matches_ref(ops::kSgdStep, dt, {g}, {w, m, Tensor(dt, {n})}, &sg);
    }
    ops::SgdAttrs plain{0.1f, 0.0f, 0.0f, 1.0f, 0, 1};
    expect_fast_matches_ref(ops::kSgdStep, dt, {g}, {w, Tensor(), Tensor()}, &plain);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OptimTest, ::testing::ValuesIn(float_dtypes()), dtype_param_name);

TEST(OptimErrors, ZeroStepAndWrongStateShape) {
  Tensor g(DType::kF32, {4}), w(DType::kF32, {4}), m(DType::kF32, {4}), v(DType::kF32, {3}), none;
  ops::AdamWAttrs at{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1};
  Status s = call_kernel(ops::kAdamWStep, "cpu.ref", DType::kF32, {&g}, {&w, &m, &v, &none}, &at);
  EXPECT_NE(s.code, Code::kOk);
  status_release(&s);
  const KernelDesc& k = kernel(ops::kAdamWStep, DType::kF32, "cpu.ref");
  CallHolder h({&g}, {&w, &m, &v, &none}, &at);
  s = k.fn(&h.call);
  EXPECT_NE(take_message(&s).find("adamw_step: output 2 (exp_avg_sq) has shape (3)"),
            std::string::npos);
  Tensor v4(DType::kF32, {4});
  at.step = 0;
  CallHolder h2({&g}, {&w, &m, &v4, &none}, &at);
  s = k.fn(&h2.call);
  EXPECT_EQ(take_message(&s), "adamw_step: step = 0 must be >= 1 (1-based)");
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
