// cross_entropy: the reference against f64, fast against reference over dtypes and odd
// vocabularies, backward of the reference against finite differences, masks and labels
// out of range.
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

struct CeInputs {
  Tensor logits, labels, mask;
};

CeInputs make(DType dt, int64_t n, int64_t v, bool with_mask, std::mt19937& rng) {
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>(rng() % v);
  CeInputs in{Tensor::random(dt, {n, v}, rng, -5, 5), Tensor::i32({n}, labels), Tensor()};
  if (with_mask) {
    in.mask = Tensor(DType::kF32, {n});
    for (int64_t i = 0; i < n; ++i) in.mask.set(i, i % 3 == 1 ? 0.0 : 1.0);
  }
  return in;
}

class CrossEntropyTest : public ::testing::TestWithParam<DType> {};

TEST_P(CrossEntropyTest, ReferenceMatchesF64AndFastMatchesReference) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  for (int64_t n : {1, 7, 33})
    for (int64_t v : {1, 7, 65, 1000})
      for (bool with_mask : {false, true}) {
        CeInputs in = make(dt, n, v, with_mask, rng);
        Tensor loss(DType::kF32, {n}), lse(DType::kF32, {n}), mean(DType::kF32, {1});
        run_ref(ops::kCrossEntropyFwd, dt, {&in.logits, &in.labels, &in.mask},
                {&loss, &lse, &mean});
        std::vector<double> el(n), expected_lse(n);
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; ++i) {
          double m = -INFINITY, s = 0;
          for (int64_t j = 0; j < v; ++j) m = std::max(m, in.logits.get(i * v + j));
          for (int64_t j = 0; j < v; ++j) s += std::exp(in.logits.get(i * v + j) - m);
          expected_lse[i] = m + std::log(s);
          el[i] = expected_lse[i] - in.logits.get(i * v + static_cast<int64_t>(in.labels.get(i)));
          double w = with_mask ? in.mask.get(i) : 1.0;
          num += w * el[i];
          den += w;
        }
        expect_close(loss, el, DType::kF32, "loss");
        expect_close(lse, expected_lse, DType::kF32, "lse");
        expect_close(mean, {den > 0 ? num / den : 0.0}, DType::kF32, "mean");
        expect_fast_matches_ref(
            ops::kCrossEntropyFwd, dt, {in.logits, in.labels, in.mask},
            {Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n}), Tensor(DType::kF32, {1})});
        Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.7);
        expect_fast_matches_ref(ops::kCrossEntropyBwd, dt,
                                {in.logits, in.labels, in.mask, lse, dmean}, {Tensor(dt, {n, v})});
      }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CrossEntropyTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

TEST(CrossEntropyGradient, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  for (bool with_mask : {false, true}) {
    CeInputs in = make(DType::kF32, 4, 5, with_mask, rng);
    auto forward = [&] {
      Tensor loss(DType::kF32, {4}), lse(DType::kF32, {4}), mean(DType::kF32, {1});
      run_ref(ops::kCrossEntropyFwd, DType::kF32, {&in.logits, &in.labels, &in.mask},
              {&loss, &lse, &mean});
      return mean.values();
    };
    Tensor loss(DType::kF32, {4}), lse(DType::kF32, {4}), mean(DType::kF32, {1});
    run_ref(ops::kCrossEntropyFwd, DType::kF32, {&in.logits, &in.labels, &in.mask},
            {&loss, &lse, &mean});
    Tensor dmean = Tensor::filled(DType::kF32, {1}, 0.8), dx(DType::kF32, {4, 5});
    run_ref(ops::kCrossEntropyBwd, DType::kF32, {&in.logits, &in.labels, &in.mask, &lse, &dmean},
            {&dx});
    expect_close(dx.values(), numeric_grad(in.logits, {0.8}, forward), fd_tolerance(), "dlogits");
  }
}

TEST(CrossEntropyLabels, OutOfRangeIsAnErrorUnlessMasked) {
  Tensor logits = Tensor::filled(DType::kF32, {3, 4}, 0.5), none;
  Tensor labels = Tensor::i32({3}, {1, 4, -100});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor loss(DType::kF32, {3}), lse(DType::kF32, {3}), mean(DType::kF32, {1});
    Status s = call_kernel(ops::kCrossEntropyFwd, name, DType::kF32, {&logits, &labels, &none},
                           {&loss, &lse, &mean});
    EXPECT_EQ(s.code, Code::kOutOfRange) << name;
    std::string msg = take_message(&s);
    EXPECT_NE(msg.find("cross_entropy_fwd: labels[1] = 4 is outside [0, 4)"), std::string::npos)
        << msg;
    // Masked out, the same labels are fine and get loss 0.
    Tensor mask = Tensor::filled(DType::kF32, {3}, 1.0);
    mask.set(1, 0.0);
    mask.set(2, 0.0);
    run(ops::kCrossEntropyFwd, name, DType::kF32, {&logits, &labels, &mask}, {&loss, &lse, &mean});
    EXPECT_EQ(loss.get(1), 0.0);
    EXPECT_EQ(loss.get(2), 0.0);
    EXPECT_NEAR(mean.get(0), std::log(4.0), 1e-6);  // uniform logits: loss = log V
    Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.0), dx(DType::kF32, {3, 4});
    run(ops::kCrossEntropyBwd, name, DType::kF32, {&logits, &labels, &mask, &lse, &dmean}, {&dx});
    EXPECT_NEAR(dx.get(1), 0.25 - 1.0, 1e-6);
    for (int64_t j = 4; j < 12; ++j) EXPECT_EQ(dx.get(j), 0.0) << j;
  }
}

TEST(CrossEntropyMask, AllZeroMaskGivesZeroMeanAndGradient) {
  std::mt19937 rng(3);
  CeInputs in = make(DType::kF32, 3, 6, true, rng);
  for (int i = 0; i < 3; ++i) in.mask.set(i, 0.0);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor loss(DType::kF32, {3}), lse(DType::kF32, {3}),
        mean = Tensor::filled(DType::kF32, {1}, 9);
    run(ops::kCrossEntropyFwd, name, DType::kF32, {&in.logits, &in.labels, &in.mask},
        {&loss, &lse, &mean});
    EXPECT_EQ(mean.get(0), 0.0) << name;
    Tensor dmean = Tensor::filled(DType::kF32, {1}, 1.0),
           dx = Tensor::filled(DType::kF32, {3, 6}, 5);
    run(ops::kCrossEntropyBwd, name, DType::kF32, {&in.logits, &in.labels, &in.mask, &lse, &dmean},
        {&dx});
    for (int64_t j = 0; j < 18; ++j) EXPECT_EQ(dx.get(j), 0.0) << name << " " << j;
  }
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
