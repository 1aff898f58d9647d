// Dropout and its Philox4x32-10 stream: the generator against Random123's published
// known-answer vectors, the fast mask bit-identical to the reference's, the keep rate,
// and backward redrawing forward's mask.
#include <loom/cpp/philox.h>

#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

TEST(Philox, MatchesRandom123KnownAnswers) {
  // kat_vectors of Random123 1.09, philox4x32_10.
  Philox4 zero = philox4x32_10_block(Philox4{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(zero.w[0], 0x6627e8d5u);
  EXPECT_EQ(zero.w[1], 0xe169c58du);
  EXPECT_EQ(zero.w[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.w[3], 0x9b00dbd8u);
  Philox4 ones = philox4x32_10_block(Philox4{{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  EXPECT_EQ(ones.w[0], 0x408f276du);
  EXPECT_EQ(ones.w[1], 0x41c83b0eu);
  EXPECT_EQ(ones.w[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.w[3], 0x6d5451fdu);
  Philox4 pi = philox4x32_10_block(Philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                   0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.w[0], 0xd16cfe09u);
  EXPECT_EQ(pi.w[1], 0x94fdccebu);
  EXPECT_EQ(pi.w[2], 0x5001e420u);
  EXPECT_EQ(pi.w[3], 0x24126ea1u);
  // loom's 64-bit key / counter: low words first, upper counter words zero.
  Philox4 a = philox4x32_10(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull);
  Philox4 b =
      philox4x32_10_block(Philox4{{0x243f6a88u, 0x85a308d3u, 0, 0}}, 0xa4093822u, 0x299f31d0u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.w[i], b.w[i]);
}

TEST(Philox, KeepThresholdIsExact) {
  EXPECT_EQ(keep_threshold(0.0f), 0u);
  EXPECT_EQ(keep_threshold(0.5f), 1u << 23);
  // (word >> 8) * 2^-24 >= p for the smallest kept value.
  float p = 0.1f;
  uint32_t t = keep_threshold(p);
  EXPECT_GE(static_cast<double>(t) / 16777216.0, static_cast<double>(p));
  EXPECT_LT(static_cast<double>(t - 1) / 16777216.0, static_cast<double>(p));
}

class DropoutTest : public ::testing::TestWithParam<DType> {};

TEST_P(DropoutTest, FastMaskIsBitIdenticalToReference) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  for (int64_t n : {1, 3, 7, 33, 4097, 10001})
    for (float p : {0.0f, 0.1f, 0.5f}) {
      Tensor x = Tensor::random(dt, {n}, rng, 0.5, 1.5);  // never zero: zeros mean "dropped"
      ops::DropoutAttrs at{p, 0x123456789abcdefull, (1ull << 32) - 3};  // counter crosses 2^32
      Tensor yr(dt, {n}), yf(dt, {n});
      run(ops::kDropoutFwd, "cpu.ref", dt, {&x}, {&yr}, &at);
      run(ops::kDropoutFwd, "cpu.fast", dt, {&x}, {&yf}, &at);
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(yr.get(i) == 0.0, yf.get(i) == 0.0) << "mask differs at " << i;
        kept += yr.get(i) != 0.0;
        // The mask is the Philox bit of element i.
        ASSERT_EQ(yr.get(i) != 0.0, philox_keep(at.key, at.counter, i, keep_threshold(p))) << i;
      }
      if (n > 4000) {
        EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.02) << "p " << p;
      }
      expect_close(yf, yr.values(), dt, "dropout values");
      std::vector<double> expected(n);
      for (int64_t i = 0; i < n; ++i) {
        Tensor one(dt, {1});
        one.set(0, x.get(i) / (1.0 - p));
        expected[i] = yr.get(i) == 0.0 ? 0.0 : one.get(0);
      }
      expect_close(yr, expected, dt, "dropout scale 1 / (1 - p)");
    }
}

TEST_P(DropoutTest, BackwardRedrawsForwardMask) {
  std::mt19937 rng(2);
  DType dt = GetParam();
  ops::DropoutAttrs at{0.3f, 77, 5};
  Tensor x = Tensor::random(dt, {1000}, rng, 0.5, 1.5),
         dy = Tensor::random(dt, {1000}, rng, 0.5, 1.5);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor y(dt, {1000}), dx(dt, {1000});
    run(ops::kDropoutFwd, name, dt, {&x}, {&y}, &at);
    run(ops::kDropoutBwd, name, dt, {&dy}, {&dx}, &at);
    for (int64_t i = 0; i < 1000; ++i)
      ASSERT_EQ(y.get(i) == 0.0, dx.get(i) == 0.0) << name << " " << i;
  }
  ops::DropoutAttrs other{0.3f, 78, 5};
  Tensor y1(dt, {1000}), y2(dt, {1000});
  run(ops::kDropoutFwd, "cpu.fast", dt, {&x}, {&y1}, &at);
  run(ops::kDropoutFwd, "cpu.fast", dt, {&x}, {&y2}, &other);
  int64_t same = 0;
  for (int64_t i = 0; i < 1000; ++i) same += (y1.get(i) == 0.0) == (y2.get(i) == 0.0);
  EXPECT_LT(same, 800) << "another key must draw another mask";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DropoutTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

TEST(DropoutErrors, ProbabilityOutOfRangeNamesOp) {
  Tensor x(DType::kF32, {4}), y(DType::kF32, {4});
  ops::DropoutAttrs at{1.0f, 0, 0};
  CallHolder h({&x}, {&y}, &at);
  Status s = kernel(ops::kDropoutFwd, DType::kF32, "cpu.ref").fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_EQ(take_message(&s).rfind("dropout_fwd: drop probability p = 1", 0), 0u);
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
