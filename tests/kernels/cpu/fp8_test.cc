// FP8 ops: the host conversions against a brute-force nearest-value search over all codes,
// fp8_quantize / fp8_gemm / fp8_scale_update references against computations written here,
// swiglu_fp8_fwd / _bwd against swiglu then fp8_quantize on each kernel library, bit for bit,
// rope_fp8_bwd against split_qkv, rope_bwd, merge_qkv and fp8_quantize likewise,
// fast against reference (and every device linked in, op_test_util.h; for fp8_gemm, the
// devices against the oracle at the bound of loom/ops/fp8.h, declines only where its rule
// allows), and bad calls.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>

#include "tests/kernels/cpu/op_test_util.h"
#include "tests/kernels/device_backend.h"

namespace loom::kernels::cpu::testing {
namespace {

const DType kFp8[] = {DType::kF8E4M3, DType::kF8E5M2};
constexpr const NoAttrs* kNone = nullptr;

// The oracle of f32 -> FP8: the finite code nearest to x, ties to the code with an even
// mantissa (last bit 0), magnitudes beyond the largest finite one saturated, NaN to NaN.
uint8_t oracle_encode(float x, DType t) {
  const float max = fp8_format(t).max;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= max) return static_cast<uint8_t>(sign | (t == DType::kF8E5M2 ? 0x7b : 0x7e));
  uint8_t best = 0;
  double best_diff = INFINITY;
  for (int c = 0; c < 0x80; ++c) {
    double v = fp8_to_f32(static_cast<uint8_t>(c), t);
    if (!std::isfinite(v)) continue;
    double d = std::fabs(v - a);
    if (d < best_diff || (d == best_diff && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_diff = d;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

TEST(Fp8Conversion, KnownCodes) {
  EXPECT_EQ(f32_to_fp8(1.0f, DType::kF8E4M3), 0x38);
  EXPECT_EQ(f32_to_fp8(448.0f, DType::kF8E4M3), 0x7e);
  EXPECT_EQ(f32_to_fp8(-448.0f, DType::kF8E4M3), 0xfe);
  EXPECT_EQ(f32_to_fp8(std::ldexp(1.0f, -9), DType::kF8E4M3), 0x01);  // smallest subnormal
  EXPECT_EQ(f32_to_fp8(1.0f, DType::kF8E5M2), 0x3c);
  EXPECT_EQ(f32_to_fp8(57344.0f, DType::kF8E5M2), 0x7b);
  EXPECT_EQ(f32_to_fp8(std::ldexp(1.0f, -16), DType::kF8E5M2), 0x01);
  EXPECT_EQ(fp8_to_f32(0x7e, DType::kF8E4M3), 448.0f);
  EXPECT_EQ(fp8_to_f32(0x08, DType::kF8E4M3), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_to_f32(0x07, DType::kF8E4M3), 7 * std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_to_f32(0x7f, DType::kF8E4M3)));
  EXPECT_TRUE(std::isnan(fp8_to_f32(0xff, DType::kF8E4M3)));
  EXPECT_EQ(fp8_to_f32(0x7c, DType::kF8E5M2), INFINITY);
  EXPECT_TRUE(std::isnan(fp8_to_f32(0x7d, DType::kF8E5M2)));
  EXPECT_EQ(fp8_to_f32(0x03, DType::kF8E5M2), 3 * std::ldexp(1.0f, -16));
}

TEST(Fp8Conversion, EveryFiniteCodeRoundTrips) {
  for (DType t : kFp8)
    for (int c = 0; c < 256; ++c) {
      float v = fp8_to_f32(static_cast<uint8_t>(c), t);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(f32_to_fp8(v, t), c) << dtype_name(t) << " code " << c << " = " << v;
    }
}

TEST(Fp8Conversion, MatchesNearestValueSearch) {
  std::mt19937 rng(5);
  for (DType t : kFp8) {
    std::vector<float> xs = {0.0f,
                             -0.0f,
                             INFINITY,
                             -INFINITY,
                             FLT_MAX,
                             1e-30f,
                             -1e-30f,
                             FLT_MIN,
                             fp8_format(t).max * 1.01f,
                             fp8_format(t).max * 0.999f};
    // Every midpoint between neighbouring codes (the ties), and just either side of it.
    for (int c = 0; c + 1 < 0x80; ++c) {
      float lo = fp8_to_f32(static_cast<uint8_t>(c), t);
      float hi = fp8_to_f32(static_cast<uint8_t>(c + 1), t);
      if (!std::isfinite(hi)) continue;
      float mid = (lo + hi) / 2;
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
    std::uniform_real_distribution<float> expo(-20.0f, 18.0f);
    for (int i = 0; i < 20000; ++i) xs.push_back((i % 2 ? -1 : 1) * std::exp2(expo(rng)));
    for (float x : xs)
      ASSERT_EQ(f32_to_fp8(x, t), oracle_encode(x, t)) << dtype_name(t) << " x = " << x;
    EXPECT_TRUE(std::isnan(fp8_to_f32(f32_to_fp8(NAN, t), t))) << dtype_name(t);
  }
}

// ---- fp8_quantize ---------------------------------------------------------------------

class Fp8QuantizeTest : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8QuantizeTest, ReferenceMatchesOracleAndTransposes) {
  std::mt19937 rng(11);
  for (DType out : kFp8)
    for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {65, 20}}) {
      Tensor x = Tensor::random(GetParam(), {m, k}, rng, -5.0, 5.0);
      x.set(0, 0.0);
      const float scale = out == DType::kF8E4M3 ? 80.0f : 9000.0f;  // some values saturate
      Tensor s = Tensor::filled(DType::kF32, {1}, scale);
      Tensor y(out, {m, k}), yt(out, {k, m}), amax = Tensor::filled(DType::kF32, {1}, 0.25);
      run_ref(ops::kFp8Quantize, GetParam(), {&x, &s}, {&y, &yt, &amax});
      double expected_amax = 0.25;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) {
          float v = static_cast<float>(x.get(i * k + j));
          uint8_t want = oracle_encode(v * scale, out);
          ASSERT_EQ(static_cast<const uint8_t*>(y.raw())[i * k + j], want) << i << "," << j;
          ASSERT_EQ(static_cast<const uint8_t*>(yt.raw())[j * m + i], want) << i << "," << j;
          expected_amax = std::max(expected_amax, std::fabs(static_cast<double>(v)));
        }
      EXPECT_EQ(amax.get(0), expected_amax);
    }
}

TEST_P(Fp8QuantizeTest, FastMatchesReference) {
  std::mt19937 rng(12);
  for (DType out : kFp8)
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{1, 1}, {7, 33}, {65, 129}, {3, 5, 17}, {40, 256}}) {
      int64_t k = shape.back(), m = 1;
      for (size_t d = 0; d + 1 < shape.size(); ++d) m *= shape[d];
      Tensor x = Tensor::random(GetParam(), shape, rng, -3.0, 3.0);
      Tensor s = Tensor::filled(DType::kF32, {1}, out == DType::kF8E4M3 ? 150.0 : 20000.0);
      Tensor amax = Tensor::filled(DType::kF32, {1}, 0.0);
      expect_fast_matches_ref(
          ops::kFp8Quantize, GetParam(), {x, s},
          {Tensor(out, shape), Tensor(out, {k, m}), amax, Tensor::filled(DType::kF32, {1}, -7.0)},
          kNone, "both outputs and scale_inv");
      expect_fast_matches_ref(ops::kFp8Quantize, GetParam(), {x, s},
                              {Tensor(out, shape), Tensor(), Tensor()}, kNone, "Y only");
      expect_fast_matches_ref(ops::kFp8Quantize, GetParam(), {x, s},
                              {Tensor(), Tensor(out, {k, m}), amax}, kNone, "Yt only");
    }
}

TEST_P(Fp8QuantizeTest, NonFiniteInputs) {
  Tensor x = Tensor::filled(GetParam(), {2, 4}, 1.0);
  x.set(1, INFINITY);
  x.set(2, -INFINITY);
  x.set(5, NAN);
  Tensor s = Tensor::filled(DType::kF32, {1}, 1.0);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Tensor y(DType::kF8E4M3, {2, 4}), none, amax = Tensor::filled(DType::kF32, {1}, 0.0);
    run(ops::kFp8Quantize, name, GetParam(), {&x, &s}, {&y, &none, &amax});
    EXPECT_EQ(y.get(1), 448.0) << name << ": +inf saturates";
    EXPECT_EQ(y.get(2), -448.0) << name << ": -inf saturates";
    EXPECT_TRUE(std::isnan(y.get(5))) << name;
    EXPECT_TRUE(std::isnan(amax.get(0))) << name << ": NaN propagates into amax";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Fp8QuantizeTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// ---- swiglu_fp8_fwd / swiglu_fp8_bwd --------------------------------------------------
// The contract (loom/ops/fp8.h): the bits of swiglu_fwd (swiglu_bwd) into a tensor of X's
// dtype followed by fp8_quantize, on the same library. Each kernel (cpu.ref, cpu.fast, and
// every device linked in) against those two ops of its own; the two ops themselves are
// checked against f64 (elementwise_test) and the brute-force conversion (above).

struct Fp8Result {
  Tensor y, yt, amax;
};

// Inputs of a swiglu call: X (..., 2F) with a NaN gate, sigmoid's limits and ups past
// E4M3's range at the scale; dY (..., F).
struct SwigluInputs {
  Tensor x, dy, scale;
};
SwigluInputs swiglu_inputs(DType dt, const std::vector<int64_t>& rows, int64_t f, float scale,
                           std::mt19937& rng) {
  std::vector<int64_t> xs = rows, ds = rows;
  xs.push_back(2 * f);
  ds.push_back(f);
  SwigluInputs in{Tensor::random(dt, xs, rng, -6.0, 6.0), Tensor::random(dt, ds, rng, -40.0, 40.0),
                  Tensor::filled(DType::kF32, {1}, scale)};
  const int64_t n = in.dy.numel() / f;
  const double gates[] = {-100.0, 100.0, 30.0};
  for (int64_t k = 0; k < 3 && k < n * f; ++k) in.x.set((k % n) * 2 * f + k % f, gates[k]);
  in.x.set(2 * f - 1, 3000.0);  // the up projection of row 0's last element
  if (n * f > 4) in.x.set((n - 1) * 2 * f + f / 2, NAN);
  return in;
}

// The fused op (kernel `name`), or `name`'s swiglu into X's dtype then its fp8_quantize.
Fp8Result swiglu_fp8(const char* name, bool bwd, bool fused, SwigluInputs& in, DType out,
                     bool want_y, bool want_yt) {
  const DType dt = in.x.dtype();
  const int64_t f = in.dy.shape().back(), n = in.dy.numel() / f, k = bwd ? 2 * f : f;
  Fp8Result r{want_y ? Tensor(out, {n, k}) : Tensor(), want_yt ? Tensor(out, {k, n}) : Tensor(),
              Tensor::filled(DType::kF32, {1}, 0.25)};
  std::vector<Tensor*> outs{&r.y, &r.yt, &r.amax};
  if (fused) {
    if (bwd)
      run(ops::kSwigluFp8Bwd, name, dt, {&in.dy, &in.x, &in.scale}, outs);
    else
      run(ops::kSwigluFp8Fwd, name, dt, {&in.x, &in.scale}, outs);
    return r;
  }
  Tensor mid(dt, {n, k});
  if (bwd)
    run(ops::kSwigluBwd, name, dt, {&in.dy, &in.x}, {&mid});
  else
    run(ops::kSwigluFwd, name, dt, {&in.x}, {&mid});
  run(ops::kFp8Quantize, name, dt, {&mid, &in.scale}, outs);
  return r;
}

// Bit for bit; NaN amaxes are equal.
void expect_same_bits(const Fp8Result& a, const Fp8Result& b, const std::string& what) {
  for (auto [x, y, label] : {std::tuple{&a.y, &b.y, "Y"}, {&a.yt, &b.yt, "Yt"}}) {
    ASSERT_EQ(x->empty(), y->empty()) << what;
    if (x->empty()) continue;
    int64_t differ = 0;
    for (int64_t i = 0; i < x->numel(); ++i)
      differ +=
          static_cast<const uint8_t*>(x->raw())[i] != static_cast<const uint8_t*>(y->raw())[i];
    EXPECT_EQ(differ, 0) << what << ": " << label << " codes differ";
  }
  const double p = a.amax.get(0), q = b.amax.get(0);
  EXPECT_TRUE(p == q || (std::isnan(p) && std::isnan(q))) << what << ": amax " << p << " vs " << q;
}

class SwigluFp8Test : public ::testing::TestWithParam<DType> {};

// cpu.fast runs only with AVX2 and FMA; its cases report a skip elsewhere.
bool cpu_fast_runs() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// Kernel `name` against its own library's swiglu then fp8_quantize, bit for bit.
void expect_two_ops_bits(const char* name, DType dtype) {
  std::mt19937 rng(21);
  int64_t checked = 0;
  for (bool bwd : {false, true})
    for (DType out : kFp8)
      for (auto [rows, f] : {std::pair<std::vector<int64_t>, int64_t>{{1}, 1},
                             {{7}, 33},
                             {{65}, 20},
                             {{3, 5}, 17}}) {
        const float scale = out == DType::kF8E4M3 ? 2.0f : 300.0f;  // some values saturate
        SwigluInputs in = swiglu_inputs(dtype, rows, f, scale, rng);
        const std::string what = std::string(name) + (bwd ? " bwd " : " fwd ") + dtype_name(out) +
                                 " F " + std::to_string(f);
        for (auto [y, yt] : {std::pair{true, true}, {true, false}, {false, true}})
          expect_same_bits(swiglu_fp8(name, bwd, true, in, out, y, yt),
                           swiglu_fp8(name, bwd, false, in, out, y, yt), what);
        ++checked;
      }
  std::printf("swiglu_fp8 %s %s: %lld calls bit-identical to swiglu + fp8_quantize\n", name,
              dtype_name(dtype), static_cast<long long>(checked));
}

TEST_P(SwigluFp8Test, ReferenceGivesItsTwoOpsBits) { expect_two_ops_bits("cpu.ref", GetParam()); }

TEST_P(SwigluFp8Test, FastGivesItsTwoOpsBits) {
  if (!cpu_fast_runs()) GTEST_SKIP() << "cpu.fast needs AVX2 and FMA";
  expect_two_ops_bits("cpu.fast", GetParam());
}

// The value amax holds is the max of the rounded swiglu values, NaN included: a NaN gate
// gives a NaN code and a NaN amax; an empty call leaves amax alone.
void expect_nan_and_empty(const char* name, DType dtype) {
  std::mt19937 rng(22);
  SwigluInputs in = swiglu_inputs(dtype, {4}, 8, 1.0f, rng);
  for (bool bwd : {false, true}) {
    Fp8Result r = swiglu_fp8(name, bwd, true, in, DType::kF8E4M3, true, false);
    EXPECT_TRUE(std::isnan(r.amax.get(0))) << name;
    EXPECT_TRUE(std::isnan(r.y.get(3 * (bwd ? 16 : 8) + 4))) << name << ": the NaN gate's code";
  }
  Tensor x(dtype, {0, 6}), y(DType::kF8E4M3, {0, 3}), none;
  Tensor s = Tensor::filled(DType::kF32, {1}, 1.0), amax = Tensor::filled(DType::kF32, {1}, 0.5);
  run(ops::kSwigluFp8Fwd, name, dtype, {&x, &s}, {&y, &none, &amax});
  EXPECT_EQ(amax.get(0), 0.5) << name << ": no rows, amax unchanged";
}

TEST_P(SwigluFp8Test, ReferenceNanAndEmpty) { expect_nan_and_empty("cpu.ref", GetParam()); }

TEST_P(SwigluFp8Test, FastNanAndEmpty) {
  if (!cpu_fast_runs()) GTEST_SKIP() << "cpu.fast needs AVX2 and FMA";
  expect_nan_and_empty("cpu.fast", GetParam());
}

// On every device linked in (the CUDA kernels with a GPU): the fused kernel against that
// device's swiglu and fp8_quantize kernels, bit for bit.
TEST_P(SwigluFp8Test, DevicesGiveTheirTwoOpsBits) {
  std::mt19937 rng(23);
  std::string skipped;
  int ran = 0;
  for (::loom::kernels::testing::DeviceBackend* b : ::loom::kernels::testing::device_backends()) {
    std::string why;
    if (!b->available(&why)) {
      skipped += std::string(b->name()) + ": " + why + "; ";
      continue;
    }
    ++ran;
    for (bool bwd : {false, true})
      for (DType out : kFp8)
        for (auto [n, f] : {std::pair<int64_t, int64_t>{128, 192}, {80, 136}, {37, 50}}) {
          SwigluInputs in =
              swiglu_inputs(GetParam(), {n}, f, out == DType::kF8E4M3 ? 2.0f : 300.0f, rng);
          const int64_t k = bwd ? 2 * f : f;
          const std::string label = std::string(b->name()) + (bwd ? " bwd " : " fwd ") +
                                    dtype_name(out) + " (" + std::to_string(n) + ", " +
                                    std::to_string(f) + ")";
          std::vector<Tensor> fused_in = bwd ? std::vector<Tensor>{in.dy, in.x, in.scale}
                                             : std::vector<Tensor>{in.x, in.scale};
          const std::vector<Tensor> outs{Tensor(out, {n, k}), Tensor(out, {k, n}),
                                         Tensor::filled(DType::kF32, {1}, 0.25),
                                         Tensor::filled(DType::kF32, {1}, -7.0)};
          const KernelDesc* fk =
              b->kernel(bwd ? ops::kSwigluFp8Bwd : ops::kSwigluFp8Fwd, GetParam());
          const KernelDesc* sk = b->kernel(bwd ? ops::kSwigluBwd : ops::kSwigluFwd, GetParam());
          const KernelDesc* qk = b->kernel(ops::kFp8Quantize, GetParam());
          ASSERT_TRUE(fk && sk && qk) << label << ": a kernel is missing";
          std::vector<Tensor> fused = run_on_device(*b, *fk, fused_in, outs, kNone, label);
          std::vector<Tensor> act_in =
              bwd ? std::vector<Tensor>{in.dy, in.x} : std::vector<Tensor>{in.x};
          std::vector<Tensor> mid =
              run_on_device(*b, *sk, act_in, {Tensor(GetParam(), {n, k})}, kNone, label);
          ASSERT_FALSE(fused.empty() || mid.empty()) << label;
          std::vector<Tensor> q_in{mid[0], in.scale};
          std::vector<Tensor> two = run_on_device(*b, *qk, q_in, outs, kNone, label);
          ASSERT_FALSE(two.empty()) << label;
          expect_same_bits({fused[0], fused[1], fused[2]}, {two[0], two[1], two[2]}, label);
          const float inv = 1.0f / static_cast<float>(in.scale.get(0));  // fp8_scale_update's
          EXPECT_EQ(fused[3].get(0), inv) << label << ": the fused op's scale_inv";
          EXPECT_EQ(two[3].get(0), inv) << label << ": fp8_quantize's scale_inv";
        }
  }
  if (ran == 0) GTEST_SKIP() << "no device: " << skipped;
}

// ---- rope_fp8_bwd ---------------------------------------------------------------------
// The contract (loom/ops/fp8.h): the bits of split_qkv, rope_bwd on the query and key heads,
// merge_qkv and fp8_quantize, on the same library. Each kernel against those four ops of its
// own; rope_bwd itself is checked against f64 and as rope_fwd's adjoint (layout_test).

// A rope_fp8_bwd call's inputs: dX (B, T, G, (H/G + 2) D) with values past E4M3's range at
// the scale and a NaN; positions (B, T) far past 2 pi, or none; Llama's inverse frequencies.
struct RopeFp8Inputs {
  Tensor x, positions, inv_freq, scale;
  ops::RopeFp8Attrs attrs;
  int64_t b, t, g, per_group;
};
RopeFp8Inputs rope_fp8_inputs(DType dt, int64_t b, int64_t t, int64_t g, int64_t per_group,
                              int64_t d, int64_t rotary, bool positions, bool nan, float scale,
                              std::mt19937& rng) {
  const int64_t width = (per_group + 2) * d;
  RopeFp8Inputs in{Tensor::random(dt, {b, t, g, width}, rng, -4.0, 4.0),
                   Tensor(),
                   Tensor(DType::kF32, {rotary / 2}),
                   Tensor::filled(DType::kF32, {1}, scale),
                   ops::RopeFp8Attrs{static_cast<int32_t>(rotary), static_cast<int32_t>(d)},
                   b,
                   t,
                   g,
                   per_group};
  if (positions) {
    std::vector<int32_t> pos(static_cast<size_t>(b * t));
    for (int32_t& p : pos) p = static_cast<int32_t>(rng() % 100000);
    in.positions = Tensor::i32({b, t}, pos);
  }
  for (int64_t i = 0; i < rotary / 2; ++i)
    in.inv_freq.set(i, std::pow(10000.0, -2.0 * static_cast<double>(i) / rotary));
  const int64_t n = b * t * g * width;
  in.x.set(n - 1, 3000.0);                         // a value head's last channel
  if (n > 2 * width) in.x.set(width + 1, 2000.0);  // group 1's first query (or token 1's), rotated
  if (nan) in.x.set(n / 2 + d / 2, NAN);
  return in;
}

// The bytes of `t` as an (m, k) tensor (merge_qkv's (B, T, G, W) as the (B T, G W) matrix the
// QKV projection's GEMMs see).
Tensor as_rows(const Tensor& t, int64_t m, int64_t k) {
  Tensor r(t.dtype(), {m, k});
  std::memcpy(r.raw(), t.raw(), static_cast<size_t>(m * k) * dtype_size(t.dtype()));
  return r;
}

// The fused op (kernel `name`), or `name`'s split_qkv, rope_bwd, merge_qkv and fp8_quantize.
Fp8Result rope_fp8(const char* name, bool fused, RopeFp8Inputs& in, DType out, bool want_y,
                   bool want_yt) {
  const DType dt = in.x.dtype();
  const int64_t d = in.attrs.head_dim, m = in.b * in.t, k = in.x.numel() / m;
  Fp8Result r{want_y ? Tensor(out, {m, k}) : Tensor(), want_yt ? Tensor(out, {k, m}) : Tensor(),
              Tensor::filled(DType::kF32, {1}, 0.25)};
  std::vector<Tensor*> outs{&r.y, &r.yt, &r.amax};
  if (fused) {
    run(ops::kRopeFp8Bwd, name, dt, {&in.x, &in.positions, &in.inv_freq, &in.scale}, outs,
        &in.attrs);
    return r;
  }
  const int64_t h = in.g * in.per_group;
  Tensor q(dt, {in.b, in.t, h, d}), kk(dt, {in.b, in.t, in.g, d}), v(dt, {in.b, in.t, in.g, d});
  run(ops::kSplitQkv, name, dt, {&in.x}, {&q, &kk, &v});
  const ops::RopeAttrs ra{in.attrs.rotary_dim};
  Tensor qr(dt, q.shape()), kr(dt, kk.shape()), mid(dt, in.x.shape());
  run(ops::kRopeBwd, name, dt, {&q, &in.positions, &in.inv_freq}, {&qr}, &ra);
  run(ops::kRopeBwd, name, dt, {&kk, &in.positions, &in.inv_freq}, {&kr}, &ra);
  run(ops::kMergeQkv, name, dt, {&qr, &kr, &v}, {&mid});
  Tensor rows = as_rows(mid, m, k);
  run(ops::kFp8Quantize, name, dt, {&rows, &in.scale}, outs);
  return r;
}

class RopeFp8Test : public ::testing::TestWithParam<DType> {};

// Kernel `name` against its own library's four ops, bit for bit: MHA, GQA and one group; whole,
// partial and no rotary channels; positions and none; 1 to 40 rows.
void expect_four_ops_bits(const char* name, DType dtype) {
  std::mt19937 rng(41);
  struct Shape {
    int64_t b, t, g, per_group, d, rotary;
    bool positions;
  };
  int64_t checked = 0;
  for (DType out : kFp8)
    for (const Shape& sh : {Shape{1, 1, 1, 1, 2, 2, false},
                            {2, 5, 2, 1, 8, 8, true},
                            {1, 40, 2, 2, 16, 8, false},
                            {3, 7, 1, 3, 6, 4, true},
                            {2, 4, 3, 1, 8, 0, true}}) {
      const float scale = out == DType::kF8E4M3 ? 2.0f : 300.0f;  // some values saturate
      RopeFp8Inputs in = rope_fp8_inputs(dtype, sh.b, sh.t, sh.g, sh.per_group, sh.d, sh.rotary,
                                         sh.positions, true, scale, rng);
      const std::string what = std::string(name) + " " + dtype_name(out) + " B " +
                               std::to_string(sh.b) + " T " + std::to_string(sh.t) + " G " +
                               std::to_string(sh.g) + " H/G " + std::to_string(sh.per_group) +
                               " D " + std::to_string(sh.d) + " rotary " +
                               std::to_string(sh.rotary);
      for (auto [y, yt] : {std::pair{true, true}, {true, false}, {false, true}})
        expect_same_bits(rope_fp8(name, true, in, out, y, yt),
                         rope_fp8(name, false, in, out, y, yt), what);
      ++checked;
    }
  std::printf(
      "rope_fp8_bwd %s %s: %lld calls bit-identical to split_qkv + rope_bwd + merge_qkv "
      "+ fp8_quantize\n",
      name, dtype_name(dtype), static_cast<long long>(checked));
}

TEST_P(RopeFp8Test, ReferenceGivesItsFourOpsBits) { expect_four_ops_bits("cpu.ref", GetParam()); }

TEST_P(RopeFp8Test, FastGivesItsFourOpsBits) {
  if (!cpu_fast_runs()) GTEST_SKIP() << "cpu.fast needs AVX2 and FMA";
  expect_four_ops_bits("cpu.fast", GetParam());
}

// The codes are of the turned values: a pair (x1, x2) of a query channel at position p comes
// out as (x1 c + x2 s, x2 c - x1 s), c = cos p w, s = sin p w (f64 here: cpu.ref's values, up to
// one rounding to the dtype and the code's); a value head's channel is quantised as it is; a
// NaN gives a NaN code and a NaN amax; an empty call leaves amax alone and writes scale_inv.
TEST_P(RopeFp8Test, CodesAreOfTheTurnedValues) {
  const DType dt = GetParam();
  std::mt19937 rng(42);
  RopeFp8Inputs in = rope_fp8_inputs(dt, 1, 3, 1, 1, 4, 4, true, false, 1.0f, rng);
  Fp8Result r = rope_fp8("cpu.ref", true, in, DType::kF8E4M3, true, false);
  const int64_t k = 12;  // (1 + 2) heads of 4
  double worst = 0;
  for (int64_t row = 0; row < 3; ++row) {
    const double p = in.positions.get(row);
    for (int64_t head = 0; head < 3; ++head)
      for (int64_t ch = 0; ch < 4; ++ch) {
        const int64_t at = row * k + head * 4 + ch, pair = ch < 2 ? ch : ch - 2;
        const double a = p * static_cast<double>(static_cast<float>(in.inv_freq.get(pair)));
        const double x1 = in.x.get(row * k + head * 4 + pair),
                     x2 = in.x.get(row * k + head * 4 + pair + 2);
        const double turned = head == 2 ? in.x.get(at)
                              : ch < 2  ? x1 * std::cos(a) + x2 * std::sin(a)
                                        : x2 * std::cos(a) - x1 * std::sin(a);
        const double want = std::clamp(turned, -448.0, 448.0);  // E4M3 saturates
        const double got = r.y.get(at);
        // E4M3 keeps 3 mantissa bits: half a step of 2^-3, plus the dtype's rounding.
        const double err = std::fabs(got - want) / std::max(std::fabs(want), std::ldexp(1.0, -6));
        worst = std::max(worst, err);
        EXPECT_LE(err, 0.0625 + 0.008) << "row " << row << " head " << head << " ch " << ch
                                       << ": code " << got << ", turned value " << want;
      }
  }
  std::printf("rope_fp8_bwd %s: codes within %.4f (relative) of the f64 turned values\n",
              dtype_name(dt), worst);
  RopeFp8Inputs bad = rope_fp8_inputs(dt, 2, 4, 1, 1, 4, 4, false, true, 1.0f, rng);
  Fp8Result nan = rope_fp8("cpu.ref", true, bad, DType::kF8E4M3, true, false);
  EXPECT_TRUE(std::isnan(nan.amax.get(0)));
  Tensor x(dt, {0, 4, 1, 12}), y(DType::kF8E4M3, {0, 12}), none, freq(DType::kF32, {2});
  Tensor s = Tensor::filled(DType::kF32, {1}, 4.0), amax = Tensor::filled(DType::kF32, {1}, 0.5);
  Tensor inv = Tensor::filled(DType::kF32, {1}, -7.0);
  const ops::RopeFp8Attrs at{4, 4};
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" && !cpu_fast_runs()) continue;
    run(ops::kRopeFp8Bwd, name, dt, {&x, &none, &freq, &s}, {&y, &none, &amax, &inv}, &at);
    EXPECT_EQ(amax.get(0), 0.5) << name << ": no rows, amax unchanged";
    EXPECT_EQ(inv.get(0), 0.25) << name << ": scale_inv written for an empty call";
  }
}

// On every device linked in (the CUDA kernel with a GPU): the fused kernel against that
// device's split_qkv, rope_bwd, merge_qkv and fp8_quantize kernels, bit for bit.
TEST_P(RopeFp8Test, DevicesGiveTheirFourOpsBits) {
  std::mt19937 rng(43);
  std::string skipped;
  int ran = 0;
  const DType dt = GetParam();
  for (::loom::kernels::testing::DeviceBackend* b : ::loom::kernels::testing::device_backends()) {
    std::string why;
    if (!b->available(&why)) {
      skipped += std::string(b->name()) + ": " + why + "; ";
      continue;
    }
    ++ran;
    struct Shape {
      int64_t b, t, g, per_group, d, rotary;
    };
    for (DType out : kFp8)
      for (const Shape& sh :
           {Shape{2, 64, 4, 1, 64, 64}, {1, 80, 2, 2, 32, 16}, {1, 37, 1, 3, 6, 4}}) {
        RopeFp8Inputs in = rope_fp8_inputs(dt, sh.b, sh.t, sh.g, sh.per_group, sh.d, sh.rotary,
                                           true, true, out == DType::kF8E4M3 ? 2.0f : 300.0f, rng);
        const int64_t m = sh.b * sh.t, k = in.x.numel() / m, h = sh.g * sh.per_group;
        const std::string label = std::string(b->name()) + " " + dtype_name(out) + " B " +
                                  std::to_string(sh.b) + " T " + std::to_string(sh.t) + " G " +
                                  std::to_string(sh.g) + " D " + std::to_string(sh.d);
        const std::vector<Tensor> outs{Tensor(out, {m, k}), Tensor(out, {k, m}),
                                       Tensor::filled(DType::kF32, {1}, 0.25),
                                       Tensor::filled(DType::kF32, {1}, -7.0)};
        const KernelDesc* fk = b->kernel(ops::kRopeFp8Bwd, dt);
        const KernelDesc* sk = b->kernel(ops::kSplitQkv, dt);
        const KernelDesc* rk = b->kernel(ops::kRopeBwd, dt);
        const KernelDesc* mk = b->kernel(ops::kMergeQkv, dt);
        const KernelDesc* qk = b->kernel(ops::kFp8Quantize, dt);
        ASSERT_TRUE(fk && sk && rk && mk && qk) << label << ": a kernel is missing";
        std::vector<Tensor> fused_in{in.x, in.positions, in.inv_freq, in.scale};
        std::vector<Tensor> fused = run_on_device(*b, *fk, fused_in, outs, &in.attrs, label);
        std::vector<Tensor> split_in{in.x};
        std::vector<Tensor> qkv =
            run_on_device(*b, *sk, split_in,
                          {Tensor(dt, {sh.b, sh.t, h, sh.d}), Tensor(dt, {sh.b, sh.t, sh.g, sh.d}),
                           Tensor(dt, {sh.b, sh.t, sh.g, sh.d})},
                          kNone, label);
        ASSERT_FALSE(fused.empty() || qkv.empty()) << label;
        const ops::RopeAttrs ra{in.attrs.rotary_dim};
        std::vector<Tensor> q_in{qkv[0], in.positions, in.inv_freq};
        std::vector<Tensor> k_in{qkv[1], in.positions, in.inv_freq};
        std::vector<Tensor> qr =
            run_on_device(*b, *rk, q_in, {Tensor(dt, qkv[0].shape())}, &ra, label);
        std::vector<Tensor> kr =
            run_on_device(*b, *rk, k_in, {Tensor(dt, qkv[1].shape())}, &ra, label);
        ASSERT_FALSE(qr.empty() || kr.empty()) << label;
        std::vector<Tensor> merge_in{qr[0], kr[0], qkv[2]};
        std::vector<Tensor> mid =
            run_on_device(*b, *mk, merge_in, {Tensor(dt, in.x.shape())}, kNone, label);
        ASSERT_FALSE(mid.empty()) << label;
        std::vector<Tensor> quant_in{as_rows(mid[0], m, k), in.scale};
        std::vector<Tensor> four = run_on_device(*b, *qk, quant_in, outs, kNone, label);
        ASSERT_FALSE(four.empty()) << label;
        expect_same_bits({fused[0], fused[1], fused[2]}, {four[0], four[1], four[2]}, label);
        EXPECT_EQ(fused[3].get(0), 1.0f / static_cast<float>(in.scale.get(0))) << label;
      }
  }
  if (ran == 0) GTEST_SKIP() << "no device: " << skipped;
}

TEST(RopeFp8, BadCallsNameTheProblem) {
  Tensor s = Tensor::filled(DType::kF32, {1}, 1.0), none, freq(DType::kF32, {4});
  auto message = [](const std::vector<Tensor*>& in, const std::vector<Tensor*>& out,
                    const ops::RopeFp8Attrs& at) {
    CallHolder h(in, out, &at);
    Status st = kernel(ops::kRopeFp8Bwd, DType::kBF16, "cpu.ref").fn(&h.call);
    return take_message(&st);
  };
  Tensor x(DType::kBF16, {2, 3, 1, 24}), y(DType::kF8E5M2, {6, 24});
  std::string m = message({&x, &none, &freq, &s}, {&y, &none, &none}, {8, 5});
  EXPECT_NE(m.find("rope_fp8_bwd: attrs.head_dim = 5 does not split input 0 (dX)'s last "
                   "dimension 24"),
            std::string::npos)
      << m;
  m = message({&x, &none, &freq, &s}, {&y, &none, &none}, {8, 12});  // 2 heads: no query
  EXPECT_NE(m.find("H/G >= 1"), std::string::npos) << m;
  m = message({&x, &none, &freq, &s}, {&y, &none, &none}, {7, 8});
  EXPECT_NE(m.find("attrs.rotary_dim = 7 must be even and in [0, head_dim = 8]"), std::string::npos)
      << m;
  Tensor freq3(DType::kF32, {3});
  m = message({&x, &none, &freq3, &s}, {&y, &none, &none}, {8, 8});
  EXPECT_NE(m.find("(rotary_dim / 2)"), std::string::npos) << m;
  Tensor pos = Tensor::i32({3, 2}, {0, 1, 2, 3, 4, 5});
  m = message({&x, &pos, &freq, &s}, {&y, &none, &none}, {8, 8});
  EXPECT_NE(m.find("(B, T)"), std::string::npos) << m;
  Tensor flat(DType::kBF16, {6, 24});
  m = message({&flat, &none, &freq, &s}, {&y, &none, &none}, {8, 8});
  EXPECT_NE(m.find("expected (B, T, G, (H/G + 2) * D)"), std::string::npos) << m;
  Tensor y_short(DType::kF8E5M2, {6, 12});
  m = message({&x, &none, &freq, &s}, {&y_short, &none, &none}, {8, 8});
  EXPECT_NE(m.find("expected (M, K) with M = 6, K = 24"), std::string::npos) << m;
  m = message({&x, &none, &freq, &s}, {&none, &none, &none}, {8, 8});
  EXPECT_NE(m.find("both empty"), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RopeFp8Test, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// ---- scale_inv, the quantising ops' optional output [3] (ABI 1.14) ----------------------

// The scale_inv fp8_scale_update writes for `scales` (kernel cpu.ref): a history of zeros
// keeps every scale, and the op writes 1 / scale beside it: the recipe state a quantising
// op's scale_inv must equal bit for bit.
std::vector<float> scale_update_inverses(const std::vector<float>& scales) {
  const int64_t q = static_cast<int64_t>(scales.size());
  Tensor fp8_max = Tensor::filled(DType::kF32, {q}, 448.0), history(DType::kF32, {1, q});
  Tensor scale(DType::kF32, {q}), scale_inv(DType::kF32, {q});
  for (int64_t i = 0; i < q; ++i) {
    history.set(i, 0.0);
    scale.set(i, scales[static_cast<size_t>(i)]);
  }
  ops::Fp8ScaleAttrs at{0, 0, -1, 0.0f};
  run_ref(ops::kFp8ScaleUpdate, DType::kF32, {&fp8_max}, {&history, &scale, &scale_inv}, &at);
  std::vector<float> out(static_cast<size_t>(q));
  for (int64_t i = 0; i < q; ++i)
    out[static_cast<size_t>(i)] = static_cast<float>(scale_inv.get(i));
  return out;
}

// Every kernel of every quantising op: with output [3] the call writes scale_inv with the
// bits fp8_scale_update gives the same scale (and 1 / scale in f32), also for an empty X;
// its other outputs are those of the three-output call; an empty [3] stays unwritten.
void expect_scale_inv_bits(const char* name) {
  const std::vector<float> scales{0.75f, 3.0f, 448.0f / 3.7f, 1e-30f, 57344.0f / 0.3f};
  const std::vector<float> inverses = scale_update_inverses(scales);
  std::mt19937 rng(31);
  int checked = 0;
  for (const char* op : {ops::kFp8Quantize, ops::kSwigluFp8Fwd, ops::kSwigluFp8Bwd})
    for (size_t i = 0; i < scales.size(); ++i)
      for (int64_t n : {int64_t{5}, int64_t{0}}) {
        const bool swiglu = op != ops::kFp8Quantize, bwd = op == ops::kSwigluFp8Bwd;
        const int64_t f = 6, k = bwd ? 2 * f : f;
        Tensor x = Tensor::random(DType::kBF16, {n, swiglu ? 2 * f : k}, rng, -2.0, 2.0);
        Tensor dy = Tensor::random(DType::kBF16, {n, f}, rng, -2.0, 2.0);
        Tensor s = Tensor::filled(DType::kF32, {1}, scales[i]);
        std::vector<Tensor*> in =
            bwd ? std::vector<Tensor*>{&dy, &x, &s} : std::vector<Tensor*>{&x, &s};
        const std::string what = std::string(name) + " " + op + " scale " +
                                 std::to_string(scales[i]) + " N " + std::to_string(n);
        Tensor y4(DType::kF8E4M3, {n, k}), yt4(DType::kF8E4M3, {k, n});
        Tensor amax4 = Tensor::filled(DType::kF32, {1}, 0.5);
        Tensor inv = Tensor::filled(DType::kF32, {1}, -7.0);
        run(op, name, DType::kBF16, in, {&y4, &yt4, &amax4, &inv});
        EXPECT_EQ(inv.get(0), inverses[i]) << what << ": not fp8_scale_update's scale_inv";
        EXPECT_EQ(static_cast<float>(inv.get(0)), 1.0f / scales[i]) << what;
        Tensor y3(DType::kF8E4M3, {n, k}), yt3(DType::kF8E4M3, {k, n});
        Tensor amax3 = Tensor::filled(DType::kF32, {1}, 0.5), none;  // none: an empty view
        run(op, name, DType::kBF16, in, {&y3, &yt3, &amax3});
        expect_same_bits({y4, yt4, amax4}, {y3, yt3, amax3}, what + " (4 outputs vs 3)");
        Tensor y5(DType::kF8E4M3, {n, k}), yt5(DType::kF8E4M3, {k, n});
        Tensor amax5 = Tensor::filled(DType::kF32, {1}, 0.5);
        run(op, name, DType::kBF16, in, {&y5, &yt5, &amax5, &none});  // [3] passed empty
        expect_same_bits({y5, yt5, amax5}, {y3, yt3, amax3}, what + " ([3] empty vs 3)");
        ++checked;
      }
  std::printf("scale_inv %s: %d calls give fp8_scale_update's bits\n", name, checked);
}

TEST(Fp8ScaleInv, ReferenceWritesTheScaleUpdatesInverse) { expect_scale_inv_bits("cpu.ref"); }

TEST(Fp8ScaleInv, FastWritesTheScaleUpdatesInverse) {
  if (!cpu_fast_runs()) GTEST_SKIP() << "cpu.fast needs AVX2 and FMA";
  expect_scale_inv_bits("cpu.fast");
}

TEST(Fp8ScaleInv, BadScaleInvNamesTheProblem) {
  Tensor x(DType::kBF16, {4, 8}), y(DType::kF8E4M3, {4, 8}), none;
  Tensor s = Tensor::filled(DType::kF32, {1}, 1.0), amax = Tensor::filled(DType::kF32, {1}, 0.0);
  auto message = [](const std::vector<Tensor*>& in, const std::vector<Tensor*>& out) {
    CallHolder h(in, out, kNone);
    Status st = kernel(ops::kFp8Quantize, DType::kBF16, "cpu.ref").fn(&h.call);
    return take_message(&st);
  };
  std::string m = message({&x, &s}, {&y, &none, &amax, &s});
  EXPECT_NE(m.find("fp8_quantize: output 3 (scale_inv) is the memory of scale"), std::string::npos)
      << m;
  m = message({&x, &s}, {&y, &none, &amax, &amax});
  EXPECT_NE(m.find("is the memory of output 2 (amax)"), std::string::npos) << m;
  Tensor two(DType::kF32, {2}), f16(DType::kF16, {1});
  m = message({&x, &s}, {&y, &none, &amax, &two});
  EXPECT_NE(m.find("output 3 (scale_inv)"), std::string::npos) << m;
  EXPECT_NE(m.find("(1)"), std::string::npos) << m;
  m = message({&x, &s}, {&y, &none, &amax, &f16});
  EXPECT_NE(m.find("output 3 (scale_inv)"), std::string::npos) << m;
  m = message({&x, &s}, {&y, &none, &amax, &none, &none});
  EXPECT_NE(m.find("4 outputs"), std::string::npos) << m;
}

TEST(SwigluFp8, BadCallsNameTheProblem) {
  Tensor s = Tensor::filled(DType::kF32, {1}, 1.0), none;
  auto message = [](const char* op, const std::vector<Tensor*>& in,
                    const std::vector<Tensor*>& out) {
    CallHolder h(in, out, kNone);
    Status st = kernel(op, DType::kBF16, "cpu.ref").fn(&h.call);
    return take_message(&st);
  };
  Tensor odd(DType::kBF16, {4, 7}), y(DType::kF8E4M3, {4, 3});
  EXPECT_NE(message(ops::kSwigluFp8Fwd, {&odd, &s}, {&y, &none, &none}).find("must be even"),
            std::string::npos);
  Tensor x(DType::kBF16, {4, 8}), y4(DType::kF8E4M3, {4, 4});
  EXPECT_NE(message(ops::kSwigluFp8Fwd, {&x, &s}, {&none, &none, &none}).find("both empty"),
            std::string::npos);
  Tensor yt_wrong(DType::kF8E4M3, {3, 4});
  EXPECT_NE(message(ops::kSwigluFp8Fwd, {&x, &s}, {&y4, &yt_wrong, &none}).find("(K, M)"),
            std::string::npos);
  Tensor y_e5(DType::kF8E5M2, {4, 4});
  EXPECT_NE(message(ops::kSwigluFp8Fwd, {&x, &s}, {&y4, &y_e5, &none}).find("one FP8 dtype"),
            std::string::npos);
  Tensor dy32(DType::kF32, {4, 4}), dx(DType::kF8E5M2, {4, 8});
  const std::string m = message(ops::kSwigluFp8Bwd, {&dy32, &x, &s}, {&dx, &none, &none});
  EXPECT_NE(m.find("swiglu_fp8_bwd: input 0 (dY) has dtype f32, expected X's bf16"),
            std::string::npos)
      << m;
  Tensor dy_short(DType::kBF16, {4, 3});
  EXPECT_NE(message(ops::kSwigluFp8Bwd, {&dy_short, &x, &s}, {&dx, &none, &none})
                .find("expected (N, F) with N = 4, F = 4"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SwigluFp8Test, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// ---- fp8_gemm -------------------------------------------------------------------------

// Random FP8 values spread over the format's range.
Tensor random_fp8(DType t, std::vector<int64_t> shape, std::mt19937& rng, double range) {
  return Tensor::random(t, std::move(shape), rng, -range, range);
}

// Y = alpha * sa * sb * A @ B^T + beta * Y in f64 from the decoded values.
std::vector<double> gemm_oracle(const Tensor& a, const Tensor& b, double sa, double sb,
                                const ops::Fp8GemmAttrs& at, const Tensor& y0) {
  int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[0];
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += a.get(i * k + p) * b.get(j * k + p);
      y[i * n + j] = at.alpha * sa * sb * acc + (at.beta != 0 ? at.beta * y0.get(i * n + j) : 0.0);
    }
  return y;
}

// What a device kernel may decline, by design (loom/ops/fp8.h): cuBLASLt's FP8 GEMMs need K
// a multiple of 16 and rows of Y a multiple of 16 bytes (this test's operands are fresh
// device allocations, so always 16-byte aligned). Any other decline is a failure.
bool device_may_decline(int64_t n, int64_t k, DType y) {
  return k % 16 != 0 || (n * static_cast<int64_t>(dtype_size(y))) % 16 != 0;
}

// The bound of loom/ops/fp8.h on a device's sum (fast_accum 0): |Y - exact| <=
// kDeviceSumRel * |alpha sa sb| * sum_k |A_ik B_jk| + f32 rounding of Y. Hopper's FP8 tensor
// cores keep about 14 mantissa bits of a partial sum between promotions to f32 (measured
// ~2e-4 of |Y| at K = 256, rtol 1e-4 fails), so the f32 table entry cannot hold there.
constexpr double kDeviceSumRel = 1.0 / 1024;

// Every device backend linked in: runs fp8_gemm on the same inputs and checks it against the
// f64 oracle at the bound above; a decline passes only where device_may_decline says so.
// Prints the achieved error as a fraction of sum |terms| ("[error] ..."), for the GPU log.
void expect_devices_match_oracle(const Tensor& a, const Tensor& b, double sa, double sb,
                                 const ops::Fp8GemmAttrs& at, const Tensor& y0,
                                 const std::vector<double>& expected, const std::string& what) {
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[0];
  for (::loom::kernels::testing::DeviceBackend* be : ::loom::kernels::testing::device_backends()) {
    std::string why;
    if (!be->available(&why)) continue;  // said once, at the start of the binary
    const std::string label = std::string("fp8_gemm on ") + be->name() + " " + what + " (" +
                              std::to_string(m) + ", " + std::to_string(n) + ", " +
                              std::to_string(k) + ") beta " + std::to_string(at.beta);
    const KernelDesc* kd = be->kernel(ops::kFp8Gemm, a.dtype());
    if (kd == nullptr) {
      ADD_FAILURE() << label << ": no kernel";
      continue;
    }
    Device dev{be->device_type(), 0};
    std::vector<void*> owned;
    auto up = [&](Tensor t) {  // a copy: view() is non-const
      TensorView v = t.view();
      v.device = dev;
      v.data = be->upload(t.raw(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
      owned.push_back(v.data);
      return v;
    };
    Tensor tsa = Tensor::filled(DType::kF32, {1}, sa), tsb = Tensor::filled(DType::kF32, {1}, sb);
    TensorView in[4] = {up(a), up(b), up(tsa), up(tsb)}, out[1] = {up(y0)};
    OpCall call{};
    call.struct_size = sizeof(OpCall);
    call.inputs = in;
    call.num_inputs = 4;
    call.outputs = out;
    call.num_outputs = 1;
    call.attrs = &at;
    call.attrs_size = sizeof at;
    if (kd->supports != nullptr && !kd->supports(&call)) {
      if (device_may_decline(n, k, y0.dtype()))
        std::printf("[fp8] %s: declined, as cuBLASLt's FP8 alignment rule says\n", label.c_str());
      else
        ADD_FAILURE() << label << ": kernel " << kd->name
                      << " declines a shape cuBLASLt's FP8 GEMMs can run (K % 16 == 0, rows of "
                         "Y a multiple of 16 bytes)";
    } else {
      Status st = kd->fn(&call);
      EXPECT_EQ(st.code, Code::kOk) << label << ": " << take_message(&st);
      status_release(&st);
      Tensor got = y0;
      be->download(got.raw(), out[0].data, static_cast<size_t>(got.numel()) * 4);
      const double scale = std::fabs(static_cast<double>(at.alpha) * sa * sb);
      double worst = 0.0;
      int64_t bad = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double mag = 0.0;
          for (int64_t p = 0; p < k; ++p) mag += std::fabs(a.get(i * k + p) * b.get(j * k + p));
          const double e = expected[i * n + j], d = std::fabs(got.get(i * n + j) - e);
          const double tol = kDeviceSumRel * scale * mag + 1e-6 * std::fabs(e) + 1e-6;
          if (scale * mag > 0) worst = std::max(worst, d / (scale * mag));
          if (!(d <= tol) && ++bad <= 5)
            ADD_FAILURE() << label << ": Y[" << i << ", " << j << "] = " << got.get(i * n + j)
                          << ", expected " << e << " (tolerance " << tol << ")";
        }
      EXPECT_EQ(bad, 0) << label;
      std::printf("[error] %s: max |diff| / (|alpha sa sb| sum |terms|) %.3g (2^%.1f)\n",
                  label.c_str(), worst, worst > 0 ? std::log2(worst) : -999.0);
    }
    for (void* p : owned) be->release(p);
  }
}

TEST(Fp8Gemm, ReferenceAndFastMatchOracle) {
  std::mt19937 rng(21);
  const std::pair<DType, DType> kinds[] = {{DType::kF8E4M3, DType::kF8E4M3},
                                           {DType::kF8E5M2, DType::kF8E4M3},
                                           {DType::kF8E4M3, DType::kF8E5M2}};
  for (auto [ta, tb] : kinds)
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 16},
                           {16, 48, 32},
                           {33, 17, 64},
                           {64, 96, 256}})
      for (float beta : {0.0f, 1.0f}) {
        Tensor a = random_fp8(ta, {m, k}, rng, 8.0), b = random_fp8(tb, {n, k}, rng, 8.0);
        Tensor sa = Tensor::filled(DType::kF32, {1}, 0.125),
               sb = Tensor::filled(DType::kF32, {1}, 0.5);
        ops::Fp8GemmAttrs at{1.5f, beta, 0};
        Tensor y = Tensor::random(DType::kF32, {m, n}, rng);
        if (beta == 0.0f) y.set(0, NAN);  // beta 0 must not read Y
        std::vector<double> expected = gemm_oracle(a, b, 0.125, 0.5, at, y);
        for (const char* name : {"cpu.ref", "cpu.fast"}) {
          Tensor got = y;
          run(ops::kFp8Gemm, name, ta, {&a, &b, &sa, &sb}, {&got}, &at);
          expect_close(got, expected, DType::kF32,
                       std::string(name) + " " + dtype_name(ta) + " x " + dtype_name(tb));
        }
        // cpu.fast against cpu.ref here; the devices against the oracle (their own bound).
        Tensor ref_y = y, fast_y = y;
        run(ops::kFp8Gemm, "cpu.ref", ta, {&a, &b, &sa, &sb}, {&ref_y}, &at);
        run(ops::kFp8Gemm, "cpu.fast", ta, {&a, &b, &sa, &sb}, {&fast_y}, &at);
        expect_close(fast_y, ref_y.values(), DType::kF32, "cpu.fast against cpu.ref");
        expect_devices_match_oracle(a, b, 0.125, 0.5, at, y, expected,
                                    std::string(dtype_name(ta)) + " x " + dtype_name(tb));
      }
}

TEST(Fp8Gemm, LowPrecisionOutputs) {
  std::mt19937 rng(22);
  Tensor a = random_fp8(DType::kF8E4M3, {32, 64}, rng, 4.0);
  Tensor b = random_fp8(DType::kF8E4M3, {48, 64}, rng, 4.0);
  Tensor sa = Tensor::filled(DType::kF32, {1}, 0.25), sb = Tensor::filled(DType::kF32, {1}, 0.25);
  ops::Fp8GemmAttrs at{1.0f, 0.0f, 1};
  std::vector<double> expected = gemm_oracle(a, b, 0.25, 0.25, at, Tensor());
  for (DType out : {DType::kBF16, DType::kF16})
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      Tensor y(out, {32, 48});
      run(ops::kFp8Gemm, name, DType::kF8E4M3, {&a, &b, &sa, &sb}, {&y}, &at);
      expect_close(y, expected, out, std::string(name) + " into " + dtype_name(out));
    }
}

// What FP8 is for: quantised with per-tensor scales, a GEMM stays close to the f32 one.
TEST(Fp8Gemm, QuantisedProductTracksTheF32Product) {
  std::mt19937 rng(23);
  const int64_t m = 64, n = 48, k = 128;
  Tensor x = Tensor::random(DType::kF32, {m, k}, rng, -2.0, 2.0);
  Tensor w = Tensor::random(DType::kF32, {n, k}, rng, -0.05, 0.05);
  auto quantise = [&](Tensor& t, double amax, Tensor* q, Tensor* scale_inv) {
    Tensor s = Tensor::filled(DType::kF32, {1}, 448.0 / amax);
    Tensor none;
    run_ref(ops::kFp8Quantize, DType::kF32, {&t, &s}, {q, &none, &none});
    *scale_inv = Tensor::filled(DType::kF32, {1}, amax / 448.0);
  };
  Tensor xq(DType::kF8E4M3, {m, k}), wq(DType::kF8E4M3, {n, k}), sx, sw;
  quantise(x, 2.0, &xq, &sx);
  quantise(w, 0.05, &wq, &sw);
  ops::Fp8GemmAttrs at{1.0f, 0.0f, 0};
  Tensor y(DType::kF32, {m, n});
  run(ops::kFp8Gemm, "cpu.fast", DType::kF8E4M3, {&xq, &wq, &sx, &sw}, {&y}, &at);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0;
      for (int64_t p = 0; p < k; ++p) exact += x.get(i * k + p) * w.get(j * k + p);
      err += (y.get(i * n + j) - exact) * (y.get(i * n + j) - exact);
      norm += exact * exact;
    }
  // E4M3 keeps 3 mantissa bits: each operand is within 2^-4 relative, the product's error
  // averages out over K to a few percent.
  EXPECT_LT(std::sqrt(err / norm), 0.05);
}

TEST(Fp8Gemm, BadCallsNameTheProblem) {
  Tensor a(DType::kF8E5M2, {4, 16}), b(DType::kF8E5M2, {8, 16}), y(DType::kF32, {4, 8});
  Tensor s = Tensor::filled(DType::kF32, {1}, 1.0);
  ops::Fp8GemmAttrs at{1.0f, 0.0f, 0};
  Status st = call_kernel(ops::kFp8Gemm, "cpu.ref", DType::kF8E5M2, {&a, &b, &s, &s}, {&y}, &at);
  EXPECT_NE(st.code, Code::kOk);
  status_release(&st);
  CallHolder h({&a, &b, &s, &s}, {&y}, &at);
  Status direct = kernel(ops::kFp8Gemm, DType::kF8E5M2, "cpu.ref").fn(&h.call);
  std::string message = take_message(&direct);
  EXPECT_NE(message.find("both fp8_e5m2"), std::string::npos) << message;
  Tensor a4(DType::kF8E4M3, {4, 16}), b4(DType::kF8E4M3, {8, 32});
  CallHolder h2({&a4, &b4, &s, &s}, {&y}, &at);
  Status k_mismatch = kernel(ops::kFp8Gemm, DType::kF8E4M3, "cpu.ref").fn(&h2.call);
  message = take_message(&k_mismatch);
  EXPECT_NE(message.find("expected (N, K) with K = 16"), std::string::npos) << message;
}

// ---- fp8_scale_update -----------------------------------------------------------------

TEST(Fp8ScaleUpdate, DelayedScalingRules) {
  // Q = 6 quantisers, L = 3 history rows; row 1 holds the newest amaxes.
  const float h0[3][6] = {{2.0f, 0.0f, 1.0f, 0.0f, 3.0f, 1e-40f},
                          {1.0f, 0.0f, NAN, INFINITY, 0.5f, 1e-40f},
                          {4.0f, 0.0f, 1.0f, 0.0f, 0.25f, 0.0f}};
  Tensor fp8_max(DType::kF32, {6});
  for (int q = 0; q < 6; ++q) fp8_max.set(q, q == 4 ? 57344.0 : 448.0);
  for (int algo : {0, 1})
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      Tensor history(DType::kF32, {3, 6});
      for (int r = 0; r < 3; ++r)
        for (int q = 0; q < 6; ++q) history.set(r * 6 + q, h0[r][q]);
      Tensor scale = Tensor::filled(DType::kF32, {6}, 7.0), scale_inv(DType::kF32, {6});
      ops::Fp8ScaleAttrs at{algo, 1, 2, 1.0f};
      run(ops::kFp8ScaleUpdate, name, DType::kF32, {&fp8_max}, {&history, &scale, &scale_inv}, &at);
      std::string what = std::string(name) + " algo " + std::to_string(algo);
      // Column 0: max 4 (algo 0) or most recent 1 (algo 1), margin 1 halves the scale.
      EXPECT_FLOAT_EQ(scale.get(0), algo == 0 ? 448.0 / 4 / 2 : 448.0 / 1 / 2) << what;
      EXPECT_EQ(scale.get(1), 7.0) << what << ": amax 0 keeps the scale";
      EXPECT_EQ(scale.get(2), 7.0) << what << ": NaN amax keeps the scale";
      EXPECT_EQ(scale.get(3), 7.0) << what << ": infinite amax keeps the scale";
      EXPECT_FLOAT_EQ(scale.get(4), algo == 0 ? 57344.0 / 3 / 2 : 57344.0 / 0.5 / 2) << what;
      EXPECT_EQ(scale.get(5), FLT_MAX) << what << ": an overflowing scale is FLT_MAX";
      for (int q = 0; q < 6; ++q) {
        EXPECT_FLOAT_EQ(scale_inv.get(q), 1.0 / scale.get(q)) << what << " q " << q;
        EXPECT_EQ(history.get(2 * 6 + q), 0.0) << what << ": row next is zeroed";
        EXPECT_EQ(history.get(0 * 6 + q), h0[0][q]) << what << ": other rows are kept";
      }
    }
}

TEST(Fp8ScaleUpdate, NoRowZeroedWithNextMinusOneAndBadAttrsRefused) {
  Tensor fp8_max = Tensor::filled(DType::kF32, {2}, 448.0);
  Tensor history = Tensor::filled(DType::kF32, {1, 2}, 2.0);
  Tensor scale = Tensor::filled(DType::kF32, {2}, 1.0), scale_inv(DType::kF32, {2});
  ops::Fp8ScaleAttrs at{1, 0, -1, 0.0f};
  run_ref(ops::kFp8ScaleUpdate, DType::kF32, {&fp8_max}, {&history, &scale, &scale_inv}, &at);
  EXPECT_EQ(history.get(0), 2.0);
  EXPECT_EQ(scale.get(1), 224.0);
  ops::Fp8ScaleAttrs bad{1, 1, -1, 0.0f};  // current outside the single row
  CallHolder h({&fp8_max}, {&history, &scale, &scale_inv}, &bad);
  Status st = kernel(ops::kFp8ScaleUpdate, DType::kF32, "cpu.ref").fn(&h.call);
  std::string message = take_message(&st);
  EXPECT_NE(message.find("attrs.current is 1, outside [0, 1)"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
