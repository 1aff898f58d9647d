// Elementwise ops and activations: fast against reference over dtypes and odd sizes; the
// reference against f64 formulas written here; backward ops against finite differences.
#include <algorithm>
#include <cmath>
#include <string>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

const std::vector<int64_t> kSizes = {1, 7, 33, 65, 127, 5000};
constexpr NoAttrs kNoAttrs{};

class ElementwiseTest : public ::testing::TestWithParam<DType> {};

TEST_P(ElementwiseTest, AddFastMatchesReferenceAcrossDtypes) {
  std::mt19937 rng(1);
  for (int64_t n : kSizes) {
    Tensor a = Tensor::random(GetParam(), {n}, rng), b = Tensor::random(DType::kF32, {n}, rng);
    Tensor y(DType::kBF16, {n});
    expect_fast_matches_ref(ops::kAdd, GetParam(), {a, b}, {y});
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = a.get(i) + b.get(i);
    run_ref(ops::kAdd, GetParam(), {&a, &b}, {&y});
    expect_close(y, expected, DType::kBF16, "add ref");
  }
}

TEST_P(ElementwiseTest, AddInPlace) {
  std::mt19937 rng(2);
  Tensor a = Tensor::random(GetParam(), {33}, rng), b = Tensor::random(GetParam(), {33}, rng);
  std::vector<double> expected(33);
  for (int i = 0; i < 33; ++i) expected[i] = a.get(i) + b.get(i);
  Tensor a2 = a;
  run(ops::kAdd, "cpu.fast", GetParam(), {&a, &b}, {&a});  // Y aliases A
  run(ops::kAdd, "cpu.ref", GetParam(), {&a2, &b}, {&a2});
  expect_close(a, expected, GetParam(), "fast in place");
  expect_close(a2, expected, GetParam(), "ref in place");
}

TEST_P(ElementwiseTest, BiasAddAndBiasGrad) {
  std::mt19937 rng(3);
  for (int64_t n : {1, 7, 65})
    for (int64_t c : {1, 33, 300}) {
      Tensor bias = Tensor::random(GetParam(), {c}, rng),
             y = Tensor::random(GetParam(), {n, c}, rng);
      expect_fast_matches_ref(ops::kBiasAdd, GetParam(), {bias}, {y});
      Tensor dbias = Tensor::random(DType::kF32, {c}, rng);
      expect_fast_matches_ref(ops::kBiasGrad, GetParam(), {y}, {dbias});
      std::vector<double> expected(c);
      for (int64_t j = 0; j < c; ++j) {
        expected[j] = dbias.get(j);
        for (int64_t i = 0; i < n; ++i) expected[j] += y.get(i * c + j);
      }
      run_ref(ops::kBiasGrad, GetParam(), {&y}, {&dbias});
      expect_close(dbias, expected, DType::kF32, "bias_grad accumulates");
    }
}

TEST_P(ElementwiseTest, CastScaleSumsq) {
  std::mt19937 rng(4);
  for (int64_t n : kSizes) {
    Tensor x = Tensor::random(GetParam(), {n}, rng, -3.0, 3.0);
    for (DType to : float_dtypes()) {
      Tensor y(to, {n});
      expect_fast_matches_ref(ops::kCast, GetParam(), {x}, {y});
      run_ref(ops::kCast, GetParam(), {&x}, {&y});
      for (int64_t i = 0; i < n; ++i) {
        Tensor one(to, {1});
        one.set(0, x.get(i));  // the harness's own round-to-nearest-even
        ASSERT_EQ(y.get(i), one.get(0)) << "cast element " << i;
      }
    }
    ops::ScaleAttrs sc{-1.75f};
    expect_fast_matches_ref(ops::kScale, GetParam(), {x}, {Tensor(GetParam(), {n})}, &sc);
    Tensor out = Tensor::filled(DType::kF64, {1}, 2.0);
    expect_fast_matches_ref(ops::kSumSq, GetParam(), {x}, {out});
    double expected = 2.0;
    for (int64_t i = 0; i < n; ++i) expected += x.get(i) * x.get(i);
    run_ref(ops::kSumSq, GetParam(), {&x}, {&out});
    EXPECT_NEAR(out.get(0), expected, 1e-9 * expected);
  }
}

// f64 (the fp64 router's casts and its aux-gradient add): to f64 exactly, from f64 rounded
// once to f32 (and through f32 to bf16 / f16, as the harness's own set() rounds), on cpu.ref,
// cpu.fast and every device, keyed on f64 and on the pair's float dtype alike.
TEST(ElementwiseF64, CastToAndFromF64) {
  std::mt19937 rng(10);
  const std::vector<DType> all = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64};
  for (int64_t n : kSizes)
    for (DType from : all)
      for (DType to : all) {
        if (from != DType::kF64 && to != DType::kF64) continue;
        Tensor x = Tensor::random(from, {n}, rng, -3.0, 3.0);
        std::vector<double> expected(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          Tensor one(to, {1});
          one.set(0, x.get(i));
          expected[i] = one.get(0);
        }
        const std::string what =
            std::string(dtype_name(from)) + " -> " + dtype_name(to) + " n " + std::to_string(n);
        for (DType key : {DType::kF64, from == DType::kF64 ? to : from})
          for (const char* name : {"cpu.ref", "cpu.fast"}) {
            if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
            Tensor y(to, {n});
            run(ops::kCast, name, key, {&x}, {&y});
            const std::vector<double> got = y.values();
            for (int64_t i = 0; i < n; ++i)
              ASSERT_EQ(got[i], expected[i]) << name << " " << what << " element " << i;
          }
        expect_fast_matches_ref(ops::kCast, DType::kF64, {x}, {Tensor(to, {n})}, &kNoAttrs, what);
      }
}

TEST(ElementwiseF64, AddInF64AndMixedF64Refused) {
  std::mt19937 rng(11);
  for (int64_t n : kSizes) {
    Tensor a = Tensor::random(DType::kF64, {n}, rng), b = Tensor::random(DType::kF64, {n}, rng);
    std::vector<double> expected(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) expected[i] = a.get(i) + b.get(i);  // one f64 rounding
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
      Tensor y(DType::kF64, {n}), a2 = a;
      run(ops::kAdd, name, DType::kF64, {&a, &b}, {&y});
      run(ops::kAdd, name, DType::kF64, {&a2, &b}, {&a2});  // in place
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(y.get(i), expected[i]) << name << " n " << n << " element " << i;
        ASSERT_EQ(a2.get(i), expected[i]) << name << " in place, n " << n << " element " << i;
      }
    }
    expect_fast_matches_ref(ops::kAdd, DType::kF64, {a, b}, {Tensor(DType::kF64, {n})});
  }
  Tensor a(DType::kF64, {4}), b(DType::kF32, {4}), y(DType::kF64, {4});
  Status s = call_kernel<NoAttrs>(ops::kAdd, "cpu.ref", DType::kF64, {&a, &b}, {&y});
  EXPECT_EQ(s.code, Code::kUnimplemented);  // supports declines it
  status_release(&s);
  const KernelDesc& k = kernel(ops::kAdd, DType::kF64, "cpu.ref");
  CallHolder h({&a, &b}, {&y}, static_cast<const NoAttrs*>(nullptr));
  s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  const std::string msg = take_message(&s);
  EXPECT_NE(msg.find("an f64 add takes f64 A, B and Y"), std::string::npos) << msg;
}

// The OpenMP runtime the kernel library links (-fopenmp): the thread count of the next
// parallel regions of this thread.
extern "C" void omp_set_num_threads(int);
extern "C" int omp_get_max_threads();

// sumsq (the gradient norm's op) gives the same bits for every thread count: the chunks' sums
// are added in a fixed order. An OpenMP reduction adds the threads' sums in the order they
// finish, which differed from run to run on a 16-core machine (2026-11-27).
TEST_P(ElementwiseTest, SumsqIsTheSameForEveryThreadCount) {
  const DType dt = GetParam();
  std::mt19937 rng(22);
  const int before = omp_get_max_threads();
  for (int64_t n : {int64_t{40000}, int64_t{100003}}) {
    const Tensor x = Tensor::random(dt, {n}, rng);
    long double oracle = 0;
    for (int64_t i = 0; i < n; ++i) oracle += static_cast<long double>(x.get(i)) * x.get(i);
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
      std::vector<double> got;
      for (int threads : {1, 3, 7, 16}) {
        omp_set_num_threads(threads);
        Tensor in = x, out = Tensor::filled(DType::kF64, {1}, 0.0);
        run(ops::kSumSq, name, dt, {&in}, {&out});
        got.push_back(out.get(0));
        EXPECT_EQ(got.back(), got.front())
            << name << " n " << n << ": " << threads << " threads against 1";
      }
      omp_set_num_threads(before);
      report_error({got.front()}, {static_cast<double>(oracle)},
                   std::string("sumsq ") + name + " n " + std::to_string(n));
      EXPECT_NEAR(got.front(), static_cast<double>(oracle), 1e-12 * static_cast<double>(oracle));
    }
  }
}

// sumsq_multi: the CPU kernels equal K sumsq calls of the same kernel bit for bit, the
// reference a long double sum written here; every device linked in (the CUDA kernel's
// tables and chunks, where a GPU is present) matches the reference to f64 rounding (the
// terms are all positive: no cancellation to excuse).
TEST_P(ElementwiseTest, SumsqMultiEqualsSumsqOfEachTensor) {
  const DType dt = GetParam();
  std::mt19937 rng(21);
  // Empty, tiny, one chunk and a bit (16384 + 3), several chunks, and odd tails.
  const std::vector<int64_t> sizes = {0, 1, 5, 16387, 40000, 7, 4096, 3};
  std::vector<Tensor> xs;
  for (int64_t n : sizes) xs.push_back(Tensor::random(dt, {n}, rng));
  const ops::SumSqMultiAttrs at{static_cast<int32_t>(xs.size())};
  long double oracle = 0.25L;  // out starts at 0.25: the op accumulates
  for (const Tensor& x : xs)
    for (int64_t i = 0; i < x.numel(); ++i) oracle += static_cast<long double>(x.get(i)) * x.get(i);
  std::vector<Tensor*> in;
  for (Tensor& x : xs) in.push_back(&x);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
    Tensor multi = Tensor::filled(DType::kF64, {1}, 0.25), each = multi;
    run(ops::kSumSqMulti, name, dt, in, {&multi}, &at);
    for (Tensor& x : xs) run(ops::kSumSq, name, dt, {&x}, {&each});
    EXPECT_EQ(multi.get(0), each.get(0)) << name;
    report_error(multi.values(), {static_cast<double>(oracle)}, std::string("sumsq_multi ") + name);
    EXPECT_NEAR(multi.get(0), static_cast<double>(oracle), 1e-12 * static_cast<double>(oracle))
        << name;
  }
  Tensor ref = Tensor::filled(DType::kF64, {1}, 0.25);
  run_ref(ops::kSumSqMulti, dt, in, {&ref}, &at);
  for (::loom::kernels::testing::DeviceBackend* b : ::loom::kernels::testing::device_backends()) {
    std::string why;
    if (!b->available(&why)) continue;  // said once, at the start of the binary
    const KernelDesc* k = b->kernel(ops::kSumSqMulti, dt);
    ASSERT_NE(k, nullptr) << b->name();
    std::vector<Tensor> got =
        run_on_device(*b, *k, xs, {Tensor::filled(DType::kF64, {1}, 0.25)}, &at, b->name());
    if (got.empty()) continue;
    report_error(got[0].values(), ref.values(), std::string("sumsq_multi on ") + b->name());
    EXPECT_NEAR(got[0].get(0), ref.get(0), 1e-12 * ref.get(0)) << b->name();
  }
}

TEST(ElementwiseSumsq, SumsqMultiRefusesMismatchedCountsAndDtypes) {
  Tensor a(DType::kF32, {4}), b(DType::kBF16, {4}), out = Tensor::filled(DType::kF64, {1}, 0);
  struct Bad {
    std::vector<Tensor*> in;
    int32_t count;
    const char* says;
  };
  const Bad bad[] = {
      {{&a, &a}, 3, "attrs.count is 3 but the call passes 2 inputs"},
      {{&a, &b}, 2, "input 1 (X[1]) has dtype bf16, expected X[0]'s f32"},
  };
  for (const Bad& x : bad)
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      const ops::SumSqMultiAttrs at{x.count};
      CallHolder h(x.in, {&out}, &at);
      const KernelDesc& k = kernel(ops::kSumSqMulti, DType::kF32, name);
      EXPECT_FALSE(k.supports(&h.call)) << x.says;
      Status s = k.fn(&h.call);
      std::string msg = take_message(&s);
      EXPECT_NE(msg.find(std::string("sumsq_multi: ") + x.says), std::string::npos) << msg;
    }
}

TEST(ElementwiseSumsq, NonFiniteGivesNonFinite) {
  Tensor x = Tensor::filled(DType::kF32, {40}, 1.0);
  x.set(17, INFINITY);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor out = Tensor::filled(DType::kF64, {1}, 0.0);
    run(ops::kSumSq, name, DType::kF32, {&x}, {&out});
    EXPECT_FALSE(std::isfinite(out.get(0))) << name;
  }
}

// ---- amax ----------------------------------------------------------------------------

TEST_P(ElementwiseTest, AmaxMatchesPlainLoopAndFastMatchesReference) {
  std::mt19937 rng(9);
  for (int64_t n : kSizes)
    for (double start : {0.0, 0.5, 10.0}) {  // 10 exceeds every |x|: out stays
      Tensor x = Tensor::random(GetParam(), {n}, rng, -3.0, 3.0);
      Tensor out = Tensor::filled(DType::kF32, {1}, start);
      expect_fast_matches_ref(ops::kAmax, GetParam(), {x}, {out});
      double expected = start;
      for (int64_t i = 0; i < n; ++i) expected = std::max(expected, std::fabs(x.get(i)));
      for (const char* name : {"cpu.ref", "cpu.fast"}) {
        Tensor got = out;
        run(ops::kAmax, name, GetParam(), {&x}, {&got});
        EXPECT_EQ(got.get(0), expected) << name << " n " << n << " start " << start;  // exact
      }
    }
}

TEST(ElementwiseAmax, EmptyInputLeavesOutUnchanged) {
  Tensor x(DType::kF32, {0});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor out = Tensor::filled(DType::kF32, {1}, -2.0);
    run(ops::kAmax, name, DType::kF32, {&x}, {&out});
    EXPECT_EQ(out.get(0), -2.0) << name;
  }
}

TEST(ElementwiseAmax, NanPropagatesAndInfinityCounts) {
  for (DType dt : float_dtypes())
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      Tensor x = Tensor::filled(dt, {40}, 1.0);
      x.set(17, NAN);
      Tensor out = Tensor::filled(DType::kF32, {1}, 0.0);
      run(ops::kAmax, name, dt, {&x}, {&out});
      EXPECT_TRUE(std::isnan(out.get(0))) << name << " " << dtype_name(dt) << ": NaN in X";

      Tensor y = Tensor::filled(dt, {40}, 1.0);
      y.set(39, -INFINITY);
      out = Tensor::filled(DType::kF32, {1}, 0.0);
      run(ops::kAmax, name, dt, {&y}, {&out});
      EXPECT_EQ(out.get(0), INFINITY) << name << " " << dtype_name(dt) << ": |-inf|";

      out = Tensor::filled(DType::kF32, {1}, NAN);
      run(ops::kAmax, name, dt, {&y}, {&out});
      EXPECT_TRUE(std::isnan(out.get(0))) << name << " " << dtype_name(dt) << ": NaN in out";
    }
}

// ---- gelu ----------------------------------------------------------------------------

double gelu64(double x, bool approx) {
  if (approx) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

TEST_P(ElementwiseTest, GeluForwardAndBackward) {
  std::mt19937 rng(5);
  for (int approx : {0, 1}) {
    ops::GeluAttrs at{approx};
    for (int64_t n : kSizes) {
      Tensor x = Tensor::random(GetParam(), {n}, rng, -6.0, 6.0);
      Tensor dy = Tensor::random(GetParam(), {n}, rng);
      expect_fast_matches_ref(ops::kGeluFwd, GetParam(), {x}, {Tensor(GetParam(), {n})}, &at);
      expect_fast_matches_ref(ops::kGeluBwd, GetParam(), {dy, x}, {Tensor(GetParam(), {n})}, &at);
      Tensor y(GetParam(), {n});
      run_ref(ops::kGeluFwd, GetParam(), {&x}, {&y}, &at);
      std::vector<double> expected(n);
      for (int64_t i = 0; i < n; ++i) expected[i] = gelu64(x.get(i), approx);
      expect_close(y, expected, GetParam(), approx ? "gelu tanh" : "gelu erf");
    }
  }
}

TEST(GeluGradient, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  for (int approx : {0, 1}) {
    ops::GeluAttrs at{approx};
    Tensor x = Tensor::random(DType::kF32, {9}, rng, -3.0, 3.0);
    Tensor dy = Tensor::random(DType::kF32, {9}, rng), dx(DType::kF32, {9});
    run_ref(ops::kGeluBwd, DType::kF32, {&dy, &x}, {&dx}, &at);
    std::vector<double> fd = numeric_grad(x, dy.values(), [&] {
      Tensor y(DType::kF32, {9});
      run_ref(ops::kGeluFwd, DType::kF32, {&x}, {&y}, &at);
      return y.values();
    });
    expect_close(dx.values(), fd, fd_tolerance(), "gelu_bwd vs finite differences");
  }
}

// ---- swiglu --------------------------------------------------------------------------

TEST_P(ElementwiseTest, SwigluForwardAndBackward) {
  std::mt19937 rng(7);
  for (int64_t n : {1, 7, 33})
    for (int64_t f : {1, 7, 65}) {
      Tensor x = Tensor::random(GetParam(), {n, 2 * f}, rng, -4.0, 4.0);
      Tensor dy = Tensor::random(GetParam(), {n, f}, rng);
      expect_fast_matches_ref(ops::kSwigluFwd, GetParam(), {x}, {Tensor(GetParam(), {n, f})});
      expect_fast_matches_ref(ops::kSwigluBwd, GetParam(), {dy, x},
                              {Tensor(GetParam(), {n, 2 * f})});
      Tensor y(GetParam(), {n, f});
      run_ref(ops::kSwigluFwd, GetParam(), {&x}, {&y});
      std::vector<double> expected(n * f);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < f; ++j) {
          double g = x.get(i * 2 * f + j), u = x.get(i * 2 * f + f + j);
          expected[i * f + j] = g / (1 + std::exp(-g)) * u;  // gate first, then up
        }
      expect_close(y, expected, GetParam(), "swiglu");
    }
}

TEST(SwigluGradient, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(8);
  Tensor x = Tensor::random(DType::kF32, {3, 10}, rng, -2.0, 2.0);
  Tensor dy = Tensor::random(DType::kF32, {3, 5}, rng), dx(DType::kF32, {3, 10});
  run_ref(ops::kSwigluBwd, DType::kF32, {&dy, &x}, {&dx});
  std::vector<double> fd = numeric_grad(x, dy.values(), [&] {
    Tensor y(DType::kF32, {3, 5});
    run_ref(ops::kSwigluFwd, DType::kF32, {&x}, {&y});
    return y.values();
  });
  expect_close(dx.values(), fd, fd_tolerance(), "swiglu_bwd vs finite differences");
}

TEST(SwigluErrors, OddWidthNamesOp) {
  Tensor x(DType::kF32, {2, 7}), y(DType::kF32, {2, 3});
  Status s = call_kernel(ops::kSwigluFwd, "cpu.ref", DType::kF32, {&x}, {&y});
  EXPECT_EQ(s.code, Code::kUnimplemented);  // supports declines
  status_release(&s);
  const KernelDesc& k = kernel(ops::kSwigluFwd, DType::kF32, "cpu.ref");
  CallHolder h({&x}, {&y}, static_cast<const NoAttrs*>(nullptr));
  s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  std::string msg = take_message(&s);
  EXPECT_NE(msg.find("swiglu_fwd: input 0 (X) has shape (2, 7)"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ElementwiseTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

}  // namespace
}  // namespace loom::kernels::cpu::testing
