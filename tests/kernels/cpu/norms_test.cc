// layernorm and rmsnorm: the reference against f64 formulas, fast against reference over
// dtypes and odd widths (with and without bias, zero-centred gamma), backward of the
// reference against finite differences (dX and the weight gradients).
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

// C = 1000, 768 and 2048 in bf16 / f16 take the CUDA warp-per-row forward (norm_warp.cuh)
// on a GPU; the others its general kernel.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},    {7, 33},  {33, 7},  {5, 127},
                                                          {3, 1000}, {9, 768}, {2, 2048}};

class NormsTest : public ::testing::TestWithParam<DType> {};

TEST_P(NormsTest, LayerNormReferenceMatchesF64) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  for (auto [n, c] : kShapes) {
    Tensor x = Tensor::random(dt, {n, c}, rng, -2.0, 3.0), w = Tensor::random(dt, {c}, rng);
    Tensor b = Tensor::random(dt, {c}, rng), y(dt, {n, c});
    Tensor mean(DType::kF32, {n}), rstd(DType::kF32, {n});
    ops::NormAttrs at{1e-5f, 1};
    run_ref(ops::kLayerNormFwd, dt, {&x, &w, &b}, {&y, &mean, &rstd}, &at);
    std::vector<double> ey(n * c), em(n), er(n);
    for (int64_t i = 0; i < n; ++i) {
      double mu = 0, var = 0;
      for (int64_t j = 0; j < c; ++j) mu += x.get(i * c + j) / c;
      for (int64_t j = 0; j < c; ++j) var += std::pow(x.get(i * c + j) - mu, 2) / c;
      em[i] = mu;
      er[i] = 1 / std::sqrt(var + 1e-5);
      for (int64_t j = 0; j < c; ++j)
        ey[i * c + j] = (x.get(i * c + j) - mu) * er[i] * (w.get(j) + 1) + b.get(j);
    }
    expect_close(y, ey, dt, "layernorm Y");
    expect_close(mean, em, DType::kF32, "layernorm mean");
    expect_close(rstd, er, DType::kF32, "layernorm rstd");
  }
}

TEST_P(NormsTest, RmsNormReferenceMatchesF64) {
  std::mt19937 rng(2);
  DType dt = GetParam();
  for (auto [n, c] : kShapes) {
    Tensor x = Tensor::random(dt, {n, c}, rng, -2.0, 3.0), w = Tensor::random(dt, {c}, rng);
    Tensor y(dt, {n, c}), rstd(DType::kF32, {n});
    ops::NormAttrs at{1e-6f, 0};
    run_ref(ops::kRmsNormFwd, dt, {&x, &w}, {&y, &rstd}, &at);
    std::vector<double> ey(n * c), er(n);
    for (int64_t i = 0; i < n; ++i) {
      double ms = 0;
      for (int64_t j = 0; j < c; ++j) ms += std::pow(x.get(i * c + j), 2) / c;
      er[i] = 1 / std::sqrt(ms + 1e-6);
      for (int64_t j = 0; j < c; ++j) ey[i * c + j] = x.get(i * c + j) * er[i] * w.get(j);
    }
    expect_close(y, ey, dt, "rmsnorm Y");
    expect_close(rstd, er, DType::kF32, "rmsnorm rstd");
  }
}

TEST_P(NormsTest, LayerNormFastMatchesReference) {
  std::mt19937 rng(3);
  DType dt = GetParam();
  for (auto [n, c] : kShapes)
    for (int zc : {0, 1})
      for (bool bias : {true, false}) {
        ops::NormAttrs at{1e-5f, zc};
        Tensor x = Tensor::random(dt, {n, c}, rng, -2.0, 3.0), w = Tensor::random(dt, {c}, rng);
        Tensor b = bias ? Tensor::random(dt, {c}, rng) : Tensor();
        expect_fast_matches_ref(
            ops::kLayerNormFwd, dt, {x, w, b},
            {Tensor(dt, {n, c}), Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n})}, &at);
        // Backward from the reference forward's statistics.
        Tensor y(dt, {n, c}), mean(DType::kF32, {n}), rstd(DType::kF32, {n});
        run_ref(ops::kLayerNormFwd, dt, {&x, &w, &b}, {&y, &mean, &rstd}, &at);
        Tensor dy = Tensor::random(dt, {n, c}, rng);
        expect_fast_matches_ref(ops::kLayerNormBwd, dt, {dy, x, w, mean, rstd},
                                {Tensor(dt, {n, c}), Tensor::random(DType::kF32, {c}, rng),
                                 bias ? Tensor::random(DType::kF32, {c}, rng) : Tensor()},
                                &at);
      }
}

TEST_P(NormsTest, RmsNormFastMatchesReference) {
  std::mt19937 rng(4);
  DType dt = GetParam();
  for (auto [n, c] : kShapes)
    for (int zc : {0, 1}) {
      ops::NormAttrs at{1e-5f, zc};
      Tensor x = Tensor::random(dt, {n, c}, rng, -2.0, 3.0), w = Tensor::random(dt, {c}, rng);
      expect_fast_matches_ref(ops::kRmsNormFwd, dt, {x, w},
                              {Tensor(dt, {n, c}), Tensor(DType::kF32, {n})}, &at);
      Tensor y(dt, {n, c}), rstd(DType::kF32, {n});
      run_ref(ops::kRmsNormFwd, dt, {&x, &w}, {&y, &rstd}, &at);
      Tensor dy = Tensor::random(dt, {n, c}, rng);
      expect_fast_matches_ref(ops::kRmsNormBwd, dt, {dy, x, w, rstd},
                              {Tensor(dt, {n, c}), Tensor::random(DType::kF32, {c}, rng)}, &at);
    }
}

// One column: x - mean = 0 exactly, so xhat = 0 and mean(g) = g, and dX = rstd * (g - mean(g))
// is exactly 0 however large rstd (316 at eps 1e-5) is: a g rounded differently in the two
// passes would leave rstd times its rounding error (the CUDA kernel is held to the same).
TEST_P(NormsTest, LayerNormBackwardOfOneColumnIsExactlyZero) {
  std::mt19937 rng(9);
  DType dt = GetParam();
  const int64_t n = 64;
  for (int32_t zc : {0, 1}) {
    ops::NormAttrs at{1e-5f, zc};
    Tensor x = Tensor::random(dt, {n, 1}, rng, -2.0, 3.0), w = Tensor::random(dt, {1}, rng);
    Tensor dy = Tensor::random(dt, {n, 1}, rng), b, y(dt, {n, 1});
    Tensor mean(DType::kF32, {n}), rstd(DType::kF32, {n});
    run_ref(ops::kLayerNormFwd, dt, {&x, &w, &b}, {&y, &mean, &rstd}, &at);
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      Tensor dx(dt, {n, 1}), dw(DType::kF32, {1}), db(DType::kF32, {1});
      run(ops::kLayerNormBwd, name, dt, {&dy, &x, &w, &mean, &rstd}, {&dx, &dw, &db}, &at);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(dx.get(i), 0.0) << name << " zc " << zc << " row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NormsTest, ::testing::ValuesIn(float_dtypes()), dtype_param_name);

// Backward of the reference against finite differences of its forward, for X, weight and
// bias (the "+=" gradients start from zero).
TEST(NormGradients, LayerNormMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const int64_t n = 3, c = 6;
  ops::NormAttrs at{1e-5f, 1};
  Tensor x = Tensor::random(DType::kF32, {n, c}, rng, -2, 2),
         w = Tensor::random(DType::kF32, {c}, rng);
  Tensor b = Tensor::random(DType::kF32, {c}, rng);
  std::vector<double> wts = random_weights(n * c, rng);
  auto forward = [&] {
    Tensor y(DType::kF32, {n, c}), mean(DType::kF32, {n}), rstd(DType::kF32, {n});
    run_ref(ops::kLayerNormFwd, DType::kF32, {&x, &w, &b}, {&y, &mean, &rstd}, &at);
    return y.values();
  };
  Tensor y(DType::kF32, {n, c}), mean(DType::kF32, {n}), rstd(DType::kF32, {n});
  run_ref(ops::kLayerNormFwd, DType::kF32, {&x, &w, &b}, {&y, &mean, &rstd}, &at);
  Tensor dy(DType::kF32, {n, c});
  for (int64_t i = 0; i < n * c; ++i) dy.set(i, wts[i]);
  Tensor dx(DType::kF32, {n, c}), dw = Tensor::filled(DType::kF32, {c}, 0),
                                  db = Tensor::filled(DType::kF32, {c}, 0);
  run_ref(ops::kLayerNormBwd, DType::kF32, {&dy, &x, &w, &mean, &rstd}, {&dx, &dw, &db}, &at);
  expect_close(dx.values(), numeric_grad(x, wts, forward), fd_tolerance(), "layernorm dX");
  expect_close(dw.values(), numeric_grad(w, wts, forward), fd_tolerance(), "layernorm dweight");
  expect_close(db.values(), numeric_grad(b, wts, forward), fd_tolerance(), "layernorm dbias");
}

TEST(NormGradients, RmsNormMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  const int64_t n = 3, c = 6;
  ops::NormAttrs at{1e-5f, 0};
  Tensor x = Tensor::random(DType::kF32, {n, c}, rng, -2, 2),
         w = Tensor::random(DType::kF32, {c}, rng);
  std::vector<double> wts = random_weights(n * c, rng);
  auto forward = [&] {
    Tensor y(DType::kF32, {n, c}), rstd(DType::kF32, {n});
    run_ref(ops::kRmsNormFwd, DType::kF32, {&x, &w}, {&y, &rstd}, &at);
    return y.values();
  };
  Tensor y(DType::kF32, {n, c}), rstd(DType::kF32, {n});
  run_ref(ops::kRmsNormFwd, DType::kF32, {&x, &w}, {&y, &rstd}, &at);
  Tensor dy(DType::kF32, {n, c});
  for (int64_t i = 0; i < n * c; ++i) dy.set(i, wts[i]);
  Tensor dx(DType::kF32, {n, c}), dw = Tensor::filled(DType::kF32, {c}, 0);
  run_ref(ops::kRmsNormBwd, DType::kF32, {&dy, &x, &w, &rstd}, {&dx, &dw}, &at);
  expect_close(dx.values(), numeric_grad(x, wts, forward), fd_tolerance(), "rmsnorm dX");
  expect_close(dw.values(), numeric_grad(w, wts, forward), fd_tolerance(), "rmsnorm dweight");
}

TEST(NormErrors, WrongWeightShapeNamesOp) {
  Tensor x(DType::kF32, {4, 8}), w(DType::kF32, {7}), y(DType::kF32, {4, 8}),
      rstd(DType::kF32, {4});
  ops::NormAttrs at{1e-5f, 0};
  const KernelDesc& k = kernel(ops::kRmsNormFwd, DType::kF32, "cpu.fast");
  CallHolder h({&x, &w}, {&y, &rstd}, &at);
  EXPECT_FALSE(k.supports(&h.call));
  Status s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  std::string msg = take_message(&s);
  EXPECT_EQ(msg, "rmsnorm_fwd: input 1 (weight) has shape (7), expected (C) = (8)");
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
