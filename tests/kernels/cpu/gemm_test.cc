// gemm: the reference against a long double computation written here, the fast (OpenBLAS)
// kernel against the reference, over dtypes (f32, bf16, f16, and f64 with A, B and Y all f64),
// odd shapes, transposes, batching and beta.
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

struct GemmCase {
  int64_t batch;  // 0: no batch dimension
  bool shared_b;
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

std::vector<GemmCase> cases() {
  std::vector<GemmCase> c;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      c.push_back({0, false, 1, 1, 1, ta, tb, 1.0f, 0.0f});
      c.push_back({0, false, 7, 33, 5, ta, tb, 1.5f, 0.5f});
      c.push_back({2, true, 33, 7, 65, ta, tb, 1.0f, 1.0f});
      c.push_back({3, false, 17, 9, 127, ta, tb, -0.5f, 0.0f});
    }
  return c;
}

struct Operands {
  Tensor a, b, y;
};

Operands make(const GemmCase& c, DType dt, DType y_dt, std::mt19937& rng) {
  std::vector<int64_t> sa = c.ta ? std::vector<int64_t>{c.k, c.m} : std::vector<int64_t>{c.m, c.k};
  std::vector<int64_t> sb = c.tb ? std::vector<int64_t>{c.n, c.k} : std::vector<int64_t>{c.k, c.n};
  std::vector<int64_t> sy = {c.m, c.n};
  if (c.batch > 0) {
    sa.insert(sa.begin(), c.batch);
    sy.insert(sy.begin(), c.batch);
    if (!c.shared_b) sb.insert(sb.begin(), c.batch);
  }
  return {Tensor::random(dt, sa, rng), Tensor::random(dt, sb, rng), Tensor::random(y_dt, sy, rng)};
}

std::vector<double> naive(const GemmCase& c, const Operands& o) {
  int64_t batch = std::max<int64_t>(c.batch, 1);
  std::vector<double> y(static_cast<size_t>(batch * c.m * c.n));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        long double acc = 0.0;  // 64-bit mantissa: an oracle for the f64 kernels too
        for (int64_t p = 0; p < c.k; ++p) {
          long double av = o.a.get(b * c.m * c.k + (c.ta ? p * c.m + i : i * c.k + p));
          int64_t b0 = c.shared_b ? 0 : b * c.k * c.n;
          long double bv = o.b.get(b0 + (c.tb ? j * c.k + p : p * c.n + j));
          acc += av * bv;
        }
        int64_t yi = (b * c.m + i) * c.n + j;
        y[yi] = static_cast<double>(
            c.alpha * acc +
            (c.beta != 0.0f ? c.beta * static_cast<long double>(o.y.get(yi)) : 0.0L));
      }
  return y;
}

std::string describe(const GemmCase& c) {
  return "batch " + std::to_string(c.batch) + (c.shared_b ? " shared B" : "") + " M " +
         std::to_string(c.m) + " N " + std::to_string(c.n) + " K " + std::to_string(c.k) + " ta " +
         std::to_string(c.ta) + " tb " + std::to_string(c.tb);
}

class GemmTest : public ::testing::TestWithParam<DType> {};

TEST_P(GemmTest, ReferenceMatchesF64) {
  std::mt19937 rng(1);
  for (const GemmCase& c : cases()) {
    Operands o = make(c, GetParam(), GetParam(), rng);
    std::vector<double> expected = naive(c, o);
    ops::GemmAttrs at{c.ta, c.tb, c.alpha, c.beta};
    run_ref(ops::kGemm, GetParam(), {&o.a, &o.b}, {&o.y}, &at);
    if (GetParam() == DType::kF64) report_error(o.y.values(), expected, "ref f64 " + describe(c));
    expect_close(o.y, expected, GetParam(), describe(c));
  }
}

TEST_P(GemmTest, FastMatchesReference) {
  std::mt19937 rng(2);
  for (const GemmCase& c : cases())
    for (DType y_dt : {GetParam(), DType::kF32}) {  // weight gradients accumulate into f32
      if (GetParam() == DType::kF64 && y_dt != DType::kF64) continue;  // f64: all three f64
      Operands o = make(c, GetParam(), y_dt, rng);
      ops::GemmAttrs at{c.ta, c.tb, c.alpha, c.beta};
      expect_fast_matches_ref(ops::kGemm, GetParam(), {o.a, o.b}, {o.y}, &at, describe(c));
    }
}

TEST_P(GemmTest, BetaZeroNeverReadsY) {
  std::mt19937 rng(3);
  GemmCase c{2, false, 5, 6, 7, false, true, 1.0f, 0.0f};
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Operands o = make(c, GetParam(), GetParam(), rng);
    std::vector<double> expected = naive(c, o);
    for (int64_t i = 0; i < o.y.numel(); ++i) o.y.set(i, NAN);
    ops::GemmAttrs at{0, 1, 1.0f, 0.0f};
    run(ops::kGemm, name, GetParam(), {&o.a, &o.b}, {&o.y}, &at);
    expect_close(o.y, expected, GetParam(), name);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmTest, ::testing::ValuesIn(float_dtypes()), dtype_param_name);
INSTANTIATE_TEST_SUITE_P(F64, GemmTest, ::testing::Values(DType::kF64), dtype_param_name);

TEST(GemmF64, FastMatchesLongDoubleAndMixedDtypesAreRefused) {
  std::mt19937 rng(4);
  for (const GemmCase& c : cases()) {
    Operands o = make(c, DType::kF64, DType::kF64, rng);
    std::vector<double> expected = naive(c, o);
    ops::GemmAttrs at{c.ta, c.tb, c.alpha, c.beta};
    if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "cpu.fast needs AVX2";
    run(ops::kGemm, "cpu.fast", DType::kF64, {&o.a, &o.b}, {&o.y}, &at);
    report_error(o.y.values(), expected, "fast f64 " + describe(c));
    expect_close(o.y, expected, DType::kF64, "fast f64 " + describe(c));
  }
  // f64 with another dtype: refused with a message (the caller casts first).
  Tensor a(DType::kF64, {3, 4}), b(DType::kF32, {4, 2}), y(DType::kF64, {3, 2});
  ops::GemmAttrs at{0, 0, 1.0f, 0.0f};
  CallHolder h({&a, &b}, {&y}, &at);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    const KernelDesc& k = kernel(ops::kGemm, DType::kF64, name);
    EXPECT_FALSE(k.supports(&h.call)) << name;
    Status s = k.fn(&h.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument);
    std::string msg = take_message(&s);
    EXPECT_NE(msg.find("an f64 gemm takes f64 A, B and Y"), std::string::npos) << msg;
  }
}

TEST(GemmErrors, WrongInnerDimensionNamesOpAndInput) {
  Tensor a(DType::kF32, {3, 4}), b(DType::kF32, {5, 2}), y(DType::kF32, {3, 2});
  ops::GemmAttrs at{0, 0, 1.0f, 0.0f};
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    const KernelDesc& k = kernel(ops::kGemm, DType::kF32, name);
    CallHolder h({&a, &b}, {&y}, &at);
    EXPECT_FALSE(k.supports(&h.call)) << name;  // find_kernel would look elsewhere
    Status s = k.fn(&h.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument);
    std::string msg = take_message(&s);
    EXPECT_EQ(s.message, nullptr);  // take_message released it
    EXPECT_NE(msg.find("gemm: input 1 (B) has shape (5, 2)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("K = 4"), std::string::npos) << msg;
  }
}

TEST(GemmErrors, MissingAttrsAndWrongOutput) {
  Tensor a(DType::kF32, {3, 4}), b(DType::kF32, {4, 2}), y(DType::kF32, {3, 3});
  Status s = call_kernel<NoAttrs>(ops::kGemm, "cpu.ref", DType::kF32, {&a, &b}, {&y});
  EXPECT_NE(s.code, Code::kOk);
  std::string msg = take_message(&s);
  const KernelDesc& k = kernel(ops::kGemm, DType::kF32, "cpu.ref");
  CallHolder h({&a, &b}, {&y}, static_cast<const NoAttrs*>(nullptr));
  s = k.fn(&h.call);
  msg = take_message(&s);
  EXPECT_NE(msg.find("gemm: attrs"), std::string::npos) << msg;
  ops::GemmAttrs at{0, 0, 1.0f, 0.0f};
  CallHolder h2({&a, &b}, {&y}, &at);
  s = k.fn(&h2.call);
  msg = take_message(&s);
  EXPECT_NE(msg.find("gemm: output 0 (Y) has shape (3, 3)"), std::string::npos) << msg;
}

TEST(GemmCost, CountsTwoFlopsPerMultiplyAdd) {
  Tensor a(DType::kBF16, {2, 3, 4}), b(DType::kBF16, {4, 5}), y(DType::kF32, {2, 3, 5});
  ops::GemmAttrs at{0, 0, 1.0f, 1.0f};
  CallHolder h({&a, &b}, {&y}, &at);
  OpCost cost{};
  const KernelDesc& k = kernel(ops::kGemm, DType::kBF16, "cpu.fast");
  Status s = k.cost(&h.call, &cost);
  ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
  EXPECT_EQ(cost.flops, 2.0 * 2 * 3 * 5 * 4);
  EXPECT_EQ(cost.bytes_read, (24 + 20) * 2.0 + 30 * 4.0);  // beta = 1 reads Y
  EXPECT_EQ(cost.bytes_written, 30 * 4.0);
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
