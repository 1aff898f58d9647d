// Runs the swiglu and rope kernels (kernels/cuda/pointwise/swiglu_kernel.cuh, rope_kernel.cuh)
// and split_qkv / merge_qkv's copy (qkv_kernel.cuh: against the layout, bit for bit) on the CPU
// under emulation (emu_prelude.h, emu_runner.h: one fiber per CUDA thread) and compares them with
// f64 references of loom/ops.h's swiglu_fwd / swiglu_bwd and rope_fwd / rope_bwd written here. Each
// case goes through the launchers' choice (swiglu_plan, rope_plan, whose outcome the test also
// checks): the typed kernels in f32, bf16 and f16, 16-byte vectors and element by element (a row
// width that is not a multiple of the vector, a base pointer one element off 16 bytes); the general
// kernels on the same cases and on dtype mixes.
//
// Tolerance: one rounding of the output to its dtype (u = 2^-24 f32, 2^-8 bf16, 2^-11 f16,
// relative to the exact value) on top of a bound of the kernels' f32 arithmetic:
// - swiglu: y, du within 8 f32 ulps (expf's 2 ulp, 1 + e, the division, the products);
//   dg = dy u s (1 + g (1 - s)) within 16 ulps of |dy u s| (1 + |g|), as 1 + g (1 - s)
//   cancels near g = -1.28 and carries s's error times g. The typed and the general kernel
//   must moreover agree bit for bit (the same f32 expressions).
// - rope: cos and sin within 2^-22 (rope_kernel.cuh's bound, checked on its own first for
//   every position 0..65536 against f64 cos / sin), the rotation's two products and sum
//   within 2^-23 (|x1| + |x2|); positions up to 65536, given and absent (token % T), Y over
//   X, rotary_dim < D (the passed-through channels must be copied exactly).
// Each group prints its worst |error| / tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/pointwise/qkv_kernel.cuh"
#include "kernels/cuda/pointwise/rope_kernel.cuh"
#include "kernels/cuda/pointwise/swiglu_kernel.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"
#include "tests/kernels/cuda/pointwise_emulation/emu_buf.h"

namespace loom::kernels::cuda::pointwise {
namespace {

using emu_test::Buf;
using emu_test::name;
using emu_test::with_type;

// Unit roundoff (half an ulp, relative) of the dtype.
double unit_roundoff(DType dt) {
  return dt == DType::kF32    ? std::ldexp(1.0, -24)
         : dt == DType::kBF16 ? std::ldexp(1.0, -8)
                              : std::ldexp(1.0, -11);
}
// Half the spacing of the dtype's subnormals: the absolute rounding error near 0.
double abs_floor(DType dt) {
  return dt == DType::kF32    ? std::ldexp(1.0, -150)
         : dt == DType::kBF16 ? std::ldexp(1.0, -134)
                              : std::ldexp(1.0, -25);
}
const double kUlp32 = std::ldexp(1.0, -24);

// Per group of cases, the worst |error| / tolerance and |error| / magnitude (swiglu: of the
// exact value, dg's: |dy u s| (1 + |g|); rope: |x1| + |x2|; magnitudes above 1e-4), printed
// at the end of a test.
struct Err {
  double to_tol = 0, to_mag = 0;
  void add(double err, double tol, double mag) {
    to_tol = std::max(to_tol, err / tol);
    if (mag > 1e-4) to_mag = std::max(to_mag, err / mag);  // f16's subnormals: tolerance only
  }
};
struct Worst {
  std::map<std::string, Err> by_group;
  void add(const std::string& g, const Err& e) {
    Err& w = by_group[g];
    w.to_tol = std::max(w.to_tol, e.to_tol);
    w.to_mag = std::max(w.to_mag, e.to_mag);
  }
  void print() const {
    for (const auto& [g, e] : by_group)
      std::printf("[error] %s: worst |diff| / tolerance %.3g, |diff| / magnitude %.3g\n", g.c_str(),
                  e.to_tol, e.to_mag);
  }
};

// ---- swiglu -------------------------------------------------------------------------------

// swiglu.cu's launcher under emulation: the plan's kernel, the launcher's geometry. A
// nonzero `generic_grid` forces the general kernel with that grid (the grid-stride loop).
SwigluPlan run_swiglu(const Buf& x, const Buf* dy, Buf& out, int64_t n, int64_t f,
                      bool force_generic = false, unsigned generic_grid = 0) {
  const void* dyp = dy ? dy->p : nullptr;
  const DType dyt = dy ? dy->dt : x.dt;
  SwigluPlan p = swiglu_plan(x.p, x.dt, dyp, dyt, out.p, out.dt, n, f);
  if (force_generic && p.typed) {
    // The general kernel on a one-dtype call: its own vec rule (4-element alignment).
    const size_t e = dtype_size(x.dt);
    auto al = [&](const void* q) { return reinterpret_cast<uintptr_t>(q) % (4 * e) == 0; };
    p = SwigluPlan{false, f % 4 == 0 && al(x.p) && al(dyp) && al(out.p), 4, n * ((f + 3) / 4)};
  }
  if (p.typed) {
    with_type(x.dt, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const SwigluTypedArgs<T> a = swiglu_typed_args<T>(p, x.p, dyp, out.p, f);
      const unsigned blocks = swiglu_typed_blocks(p);
      if (p.vec)
        emu::run_grid(blocks, kFlatThreads, [&] { swiglu_typed_kernel<T, true>(a); });
      else
        emu::run_grid(blocks, kFlatThreads, [&] { swiglu_typed_kernel<T, false>(a); });
    });
  } else {
    const unsigned grid = generic_grid ? generic_grid : grid_for(p.chunks, kFlatThreads);
    emu::run_grid(grid, kFlatThreads,
                  [&] { swiglu_kernel(x.p, x.dt, dyp, dyt, out.p, out.dt, n, f, p.vec); });
  }
  return p;
}

struct SwigluCase {
  int64_t rows, f;
  int off_x, off_dy, off_out;  // elements past 16-byte alignment
};

// Random gates and ups, with a few extremes (|g| up to 100: sigmoid's limits, no NaN).
void fill_swiglu_inputs(Buf& x, Buf* dy, int64_t rows, int64_t f, std::mt19937& rng) {
  std::uniform_real_distribution<double> ud(-6.0, 6.0);
  for (int64_t i = 0; i < x.n; ++i) x.set(i, ud(rng));
  const double extremes[] = {-100, -80, -20, -1.28, 20, 80, 100};
  for (int k = 0; k < 7 && k < f; ++k) x.set((k % rows) * 2 * f + (k * 7) % f, extremes[k]);
  if (dy)
    for (int64_t i = 0; i < dy->n; ++i) dy->set(i, ud(rng));
}

// Checks out against the f64 reference.
Err check_swiglu(const Buf& x, const Buf* dy, const Buf& out, int64_t rows, int64_t f,
                 const std::string& what) {
  const double u = unit_roundoff(out.dt), fl = abs_floor(out.dt) + 1e-36;
  Err worst;
  // The kernel's f32 arithmetic errs by at most `ulps` f32 ulps of `mag`.
  auto expect = [&](double got, double want, double mag, double ulps, const char* which, int64_t r,
                    int64_t j) {
    const double tol = u * std::fabs(want) + (1 + u) * ulps * kUlp32 * mag + fl;
    const double err = std::fabs(got - want);
    worst.add(err, tol, mag);
    EXPECT_TRUE(std::isfinite(got) && err <= tol)
        << what << ": " << which << "[" << r << ", " << j << "] is " << got << ", expected " << want
        << " (tolerance " << tol << ")";
    return std::isfinite(got) && err <= tol;
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const double g = x.get(r * 2 * f + j), up = x.get(r * 2 * f + f + j);
      const double s = 1.0 / (1.0 + std::exp(-g));
      if (dy == nullptr) {
        const double want = g * s * up;
        if (!expect(out.get(r * f + j), want, std::fabs(want), 8, "Y", r, j)) return worst;
      } else {
        const double d = dy->get(r * f + j);
        const double dg = d * up * s * (1 + g * (1 - s)), du = d * g * s;
        const double dg_mag = std::fabs(d * up * s) * (1 + std::fabs(g));
        if (!expect(out.get(r * 2 * f + j), dg, dg_mag, 16, "dX gate", r, j) ||
            !expect(out.get(r * 2 * f + f + j), du, std::fabs(du), 8, "dX up", r, j))
          return worst;
      }
    }
  return worst;
}

std::vector<SwigluCase> swiglu_cases() {
  std::vector<SwigluCase> cs;
  for (int64_t f : {4, 8, 12, 20, 1000, 1024, 1027}) {
    cs.push_back({5, f, 0, 0, 0});  // aligned
    cs.push_back({5, f, 1, 1, 1});  // every tensor one element off
    cs.push_back({3, f, 0, 0, 1});  // only the output off
  }
  cs.push_back({1, 8, 0, 0, 0});
  cs.push_back({37, 20, 0, 0, 0});  // rows across blocks (bf16: 3 chunks a row)
  cs.push_back({300, 8, 0, 1, 0});  // only dY off (backward), 300 rows
  return cs;
}

void swiglu_one_dtype(DType dt, std::mt19937& rng) {
  Worst worst;
  for (const SwigluCase& c : swiglu_cases())
    for (bool bwd : {false, true}) {
      const int64_t n = c.rows, f = c.f;
      Buf x(dt, n * 2 * f, c.off_x), dy(dt, n * f, c.off_dy);
      Buf out(dt, bwd ? n * 2 * f : n * f, c.off_out), out_g(dt, out.n, c.off_out);
      fill_swiglu_inputs(x, bwd ? &dy : nullptr, n, f, rng);
      out.fill_nan();
      out_g.fill_nan();
      const std::string what = std::string(bwd ? "swiglu_bwd " : "swiglu_fwd ") + name(dt) + " N " +
                               std::to_string(n) + " F " + std::to_string(f) + " offsets " +
                               std::to_string(c.off_x) + std::to_string(c.off_dy) +
                               std::to_string(c.off_out);
      const SwigluPlan p = run_swiglu(x, bwd ? &dy : nullptr, out, n, f);
      // The plan: typed always (one dtype); 16-byte vectors exactly when F is a multiple of
      // the vector and every tensor the kernel reads or writes is 16-byte aligned.
      const int w = static_cast<int>(16 / dtype_size(dt));
      const bool want_vec = f % w == 0 && c.off_x == 0 && c.off_out == 0 && (!bwd || c.off_dy == 0);
      ASSERT_TRUE(p.typed) << what;
      ASSERT_EQ(p.vec, want_vec) << what;
      const std::string group = std::string(bwd ? "swiglu_bwd " : "swiglu_fwd ") + name(dt) +
                                (p.vec ? " typed 16-byte" : " typed by element");
      worst.add(group, check_swiglu(x, bwd ? &dy : nullptr, out, n, f, what));
      // The general kernel on the same call (a small grid on one case: its stride loop).
      const unsigned grid = c.rows == 300 ? 2 : 0;
      const SwigluPlan pg = run_swiglu(x, bwd ? &dy : nullptr, out_g, n, f, true, grid);
      const std::string gg = std::string(bwd ? "swiglu_bwd " : "swiglu_fwd ") + name(dt) +
                             (pg.vec ? " general 4-vector" : " general by element");
      worst.add(gg, check_swiglu(x, bwd ? &dy : nullptr, out_g, n, f, what + " general"));
      EXPECT_TRUE(out.same_bits(out_g)) << what << ": the typed and general kernels differ";
      if (::testing::Test::HasFailure()) return;
    }
  worst.print();
}

TEST(PointwiseEmulation, SwigluF32) {
  std::mt19937 rng(1);
  swiglu_one_dtype(DType::kF32, rng);
}
TEST(PointwiseEmulation, SwigluBf16) {
  std::mt19937 rng(2);
  swiglu_one_dtype(DType::kBF16, rng);
}
TEST(PointwiseEmulation, SwigluF16) {
  std::mt19937 rng(3);
  swiglu_one_dtype(DType::kF16, rng);
}

// Dtype mixes take the general kernel.
TEST(PointwiseEmulation, SwigluMixedDtypes) {
  std::mt19937 rng(4);
  Worst worst;
  struct Mix {
    DType x, dy, out;
  };
  for (Mix m :
       {Mix{DType::kBF16, DType::kF32, DType::kBF16}, Mix{DType::kF32, DType::kF32, DType::kBF16},
        Mix{DType::kF16, DType::kBF16, DType::kF32}})
    for (int64_t f : {8, 20, 1027})
      for (bool bwd : {false, true}) {
        const int64_t n = 4;
        Buf x(m.x, n * 2 * f, 0), dy(m.dy, n * f, 0), out(m.out, bwd ? n * 2 * f : n * f, 0);
        fill_swiglu_inputs(x, bwd ? &dy : nullptr, n, f, rng);
        out.fill_nan();
        const std::string what = std::string(bwd ? "swiglu_bwd" : "swiglu_fwd") + " X " +
                                 name(m.x) + (bwd ? std::string(" dY ") + name(m.dy) : "") +
                                 " out " + name(m.out) + " F " + std::to_string(f);
        const SwigluPlan p = run_swiglu(x, bwd ? &dy : nullptr, out, n, f);
        // A forward whose X and Y share a dtype is a one-dtype call.
        const bool one = m.x == m.out && (!bwd || m.dy == m.x);
        ASSERT_EQ(p.typed, one) << what;
        worst.add(std::string(bwd ? "swiglu_bwd" : "swiglu_fwd") + " mixed dtypes",
                  check_swiglu(x, bwd ? &dy : nullptr, out, n, f, what));
        if (HasFailure()) return;
      }
  worst.print();
}

// ---- rope ---------------------------------------------------------------------------------

// Llama's inverse frequencies for `rot` rotated channels: base^(-2i / rot).
std::vector<float> inv_freqs(int64_t rot, double base = 10000.0) {
  std::vector<float> f(rot / 2);
  for (size_t i = 0; i < f.size(); ++i)
    f[i] = static_cast<float>(std::pow(base, -2.0 * static_cast<double>(i) / rot));
  return f;
}

const double kCosSinBound = std::ldexp(1.0, -22);  // rope_kernel.cuh's stated bound

// rope_cos_sin against f64 cos / sin of the f64 angle, every position 0..65536.
TEST(PointwiseEmulation, RopeCosSinBound) {
  double worst = 0;
  for (double base : {10000.0, 500000.0}) {
    std::vector<float> f = inv_freqs(128, base);
    f.push_back(1.0f);  // angle = position: the widest reduction
    f.push_back(3.7f);
    for (int32_t pos = 0; pos <= 65536; ++pos)
      for (float w : f) {
        float c, s;
        rope_cos_sin(static_cast<double>(pos), w, &c, &s);
        const double a = static_cast<double>(pos) * static_cast<double>(w);
        const double e = std::max(std::fabs(c - std::cos(a)), std::fabs(s - std::sin(a)));
        worst = std::max(worst, e);
        if (e > kCosSinBound) {
          ADD_FAILURE() << "position " << pos << " inv_freq " << w << ": cos " << c << " sin " << s
                        << " against " << std::cos(a) << " " << std::sin(a) << ", error " << e;
          return;
        }
      }
  }
  std::printf("[error] rope cos / sin: worst |error| %.3g (bound %.3g = 2^-22)\n", worst,
              kCosSinBound);
}

struct RopeCase {
  int64_t b, t, h, d, rot;
};

// rope.cu's launcher under emulation; `force_generic` runs the general kernel whatever the
// plan says.
// `st`: the row strides of X and Y (packed when not given).
RopePlan run_rope(const Buf& x, const int32_t* positions, const float* inv_freq, Buf& y,
                  const RopeCase& c, bool bwd, bool force_generic,
                  const RopeStrides* strides = nullptr) {
  const int64_t tokens = c.b * c.t, half = c.rot / 2;
  const RopeStrides st = strides ? *strides : rope_packed_strides(c.t, c.h, c.d);
  RopePlan p = rope_plan(x.p, x.dt, y.p, y.dt, tokens, c.t, c.h, c.d, half, st);
  if (p.typed && !force_generic) {
    with_type(x.dt, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const RopeTypedArgs<T> a =
          rope_typed_args<T>(p, x.p, positions, inv_freq, y.p, c.t, c.h, c.d, half, bwd, st);
      const unsigned blocks = rope_typed_blocks(p);
      if (p.width == 1)
        emu::run_grid(blocks, kFlatThreads, [&] { rope_typed_kernel<T, 1>(a); });
      else
        emu::run_grid(blocks, kFlatThreads, [&] { rope_typed_kernel<T, kRopeWidth<T>>(a); });
    });
    return p;
  }
  p.typed = false;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tokens, kMaxGridBlocks));
  emu::run_grid(grid, kFlatThreads, [&] {
    rope_kernel(x.p, x.dt, positions, inv_freq, y.p, y.dt, tokens, c.t, c.h, c.d, half,
                bwd ? -1.0 : 1.0, p.lanes, st);
  });
  return p;
}

// Checks y (out of x0, the input as it was) against the f64 reference; `st` gives the row
// strides of x0 and y (packed when not given).
Err check_rope(const Buf& x0, const int32_t* positions, const std::vector<float>& inv, const Buf& y,
               const RopeCase& c, bool bwd, const std::string& what,
               const RopeStrides* strides = nullptr) {
  const RopeStrides st = strides ? *strides : rope_packed_strides(c.t, c.h, c.d);
  const double u = unit_roundoff(y.dt), fl = abs_floor(y.dt);
  const double f32_bound = kCosSinBound + std::ldexp(1.0, -23);  // times |x1| + |x2|
  const int64_t half = c.rot / 2;
  Err worst;
  for (int64_t tok = 0; tok < c.b * c.t; ++tok) {
    const double pos = positions ? positions[tok] : static_cast<double>(tok % c.t);
    for (int64_t k = 0; k < c.h; ++k) {
      const int64_t b = tok / c.t, t = tok % c.t;
      const int64_t base = b * st.xb + t * st.xt + k * st.xh;   // of X's row
      const int64_t ybase = b * st.yb + t * st.yt + k * st.yh;  // of Y's
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos * static_cast<double>(inv[i]);
        const double cs = std::cos(a), sn = (bwd ? -1.0 : 1.0) * std::sin(a);
        const double x1 = x0.get(base + i), x2 = x0.get(base + i + half);
        const double want[2] = {x1 * cs - x2 * sn, x2 * cs + x1 * sn};
        for (int m = 0; m < 2; ++m) {
          const double got = y.get(ybase + i + m * half);
          const double mag = std::fabs(x1) + std::fabs(x2);
          const double tol = u * std::fabs(want[m]) + (1 + u) * f32_bound * mag + fl;
          const double err = std::fabs(got - want[m]);
          worst.add(err, tol, mag);
          if (!(err <= tol)) {
            ADD_FAILURE() << what << ": Y[token " << tok << ", head " << k << ", channel "
                          << i + m * half << "] is " << got << ", expected " << want[m]
                          << " (position " << pos << ", tolerance " << tol << ")";
            return worst;
          }
        }
      }
      // Passed through: the input, converted to Y's dtype.
      for (int64_t i = 2 * half; i < c.d; ++i) {
        Buf one(y.dt, 1, 0);
        one.set(0, x0.get(base + i));
        if (y.get(ybase + i) != one.get(0)) {
          ADD_FAILURE() << what << ": passed-through Y[token " << tok << ", head " << k
                        << ", channel " << i << "] is " << y.get(ybase + i) << ", expected "
                        << one.get(0);
          return worst;
        }
      }
    }
  }
  return worst;
}

std::vector<RopeCase> rope_cases() {
  return {
      {1, 1, 1, 2, 2},       // one pair
      {2, 5, 3, 8, 8},       // half 4: f32 vectors, bf16 / f16 by element
      {2, 7, 4, 16, 10},     // half 5 (by element), 6 passed-through channels
      {1, 9, 16, 128, 128},  // LLaMA's head: 16-byte vectors, 4 head groups
      {2, 3, 5, 64, 32},     // half 16 (vectors), 32 passed through, a group of 1 head
      {1, 4, 6, 96, 64},     // 32 passed through
      {3, 2, 7, 48, 48},     // half 24
      {2, 3, 3, 20, 16},     // half 8, D 20: f32 vectors; bf16 / f16 heads not 16-byte aligned
      {2, 3, 3, 18, 16},     // half 8, D 18: no dtype's heads 16-byte aligned
      {2, 3, 2, 64, 0},      // nothing rotated: the general kernel copies
  };
}

void rope_one_dtype(DType dt, std::mt19937& rng) {
  Worst worst;
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const RopeCase& c : rope_cases()) {
    const int64_t tokens = c.b * c.t, numel = tokens * c.h * c.d, half = c.rot / 2;
    const std::vector<float> inv = inv_freqs(c.rot);
    std::vector<int32_t> pos(tokens);
    for (auto& p : pos) p = static_cast<int32_t>(rng() % 65537);
    pos[0] = 65536;
    if (tokens > 1) pos[1] = 0;
    for (bool given : {false, true})
      for (bool bwd : {false, true})
        for (int off : {0, 1})
          for (bool in_place : {false, true}) {
            Buf x(dt, numel, off), x0(dt, numel, off), y(dt, numel, off);
            for (int64_t i = 0; i < numel; ++i) x0.set(i, nd(rng));
            std::memcpy(x.p, x0.p, numel * dtype_size(dt));
            y.fill_nan();
            Buf& out = in_place ? x : y;
            const std::string what = std::string(bwd ? "rope_bwd " : "rope_fwd ") + name(dt) +
                                     " B " + std::to_string(c.b) + " T " + std::to_string(c.t) +
                                     " H " + std::to_string(c.h) + " D " + std::to_string(c.d) +
                                     " rotary " + std::to_string(c.rot) +
                                     (given ? " positions" : "") + " offset " +
                                     std::to_string(off) + (in_place ? " Y=X" : "");
            const int32_t* pp = given ? pos.data() : nullptr;
            const RopePlan p = run_rope(x, pp, inv.data(), out, c, bwd, false);
            // The plan: typed whenever something rotates; 16-byte vectors exactly when half
            // and D are multiples of the vector and the tensors are aligned.
            const int w = static_cast<int>(16 / dtype_size(dt));
            ASSERT_EQ(p.typed, half > 0) << what;
            if (p.typed) {
              ASSERT_EQ(p.width, half % w == 0 && c.d % w == 0 && off == 0 ? w : 1) << what;
            }
            const std::string group = std::string(bwd ? "rope_bwd " : "rope_fwd ") + name(dt) +
                                      (!p.typed      ? " general"
                                       : p.width > 1 ? " typed 16-byte"
                                                     : " typed by element");
            worst.add(group, check_rope(x0, pp, inv, out, c, bwd, what));
            if (::testing::Test::HasFailure()) return;
            // The general kernel on the same call.
            if (p.typed && off == 0) {
              std::memcpy(x.p, x0.p, numel * dtype_size(dt));
              y.fill_nan();
              run_rope(x, pp, inv.data(), out, c, bwd, true);
              worst.add(std::string(bwd ? "rope_bwd " : "rope_fwd ") + name(dt) + " general",
                        check_rope(x0, pp, inv, out, c, bwd, what + " general"));
              if (::testing::Test::HasFailure()) return;
            }
          }
  }
  worst.print();
}

TEST(PointwiseEmulation, RopeF32) {
  std::mt19937 rng(5);
  rope_one_dtype(DType::kF32, rng);
}
TEST(PointwiseEmulation, RopeBf16) {
  std::mt19937 rng(6);
  rope_one_dtype(DType::kBF16, rng);
}
TEST(PointwiseEmulation, RopeF16) {
  std::mt19937 rng(7);
  rope_one_dtype(DType::kF16, rng);
}

// X and Y of different dtypes take the general kernel.
TEST(PointwiseEmulation, RopeMixedDtypes) {
  std::mt19937 rng(8);
  std::normal_distribution<double> nd(0.0, 1.0);
  Worst worst;
  for (auto [xt, yt] : {std::pair{DType::kBF16, DType::kF32}, std::pair{DType::kF32, DType::kF16}})
    for (const RopeCase& c : {RopeCase{2, 3, 5, 64, 32}, RopeCase{1, 9, 16, 128, 128}})
      for (bool bwd : {false, true}) {
        const int64_t tokens = c.b * c.t, numel = tokens * c.h * c.d;
        const std::vector<float> inv = inv_freqs(c.rot);
        std::vector<int32_t> pos(tokens);
        for (auto& p : pos) p = static_cast<int32_t>(rng() % 65537);
        Buf x(xt, numel, 0), y(yt, numel, 0);
        for (int64_t i = 0; i < numel; ++i) x.set(i, nd(rng));
        y.fill_nan();
        const std::string what = std::string(bwd ? "rope_bwd" : "rope_fwd") + " X " + name(xt) +
                                 " Y " + name(yt) + " D " + std::to_string(c.d);
        const RopePlan p = run_rope(x, pos.data(), inv.data(), y, c, bwd, false);
        ASSERT_FALSE(p.typed) << what;
        worst.add(std::string(bwd ? "rope_bwd" : "rope_fwd") + " mixed dtypes",
                  check_rope(x, pos.data(), inv, y, c, bwd, what));
        if (HasFailure()) return;
      }
  worst.print();
}

// q and k as views of a fused QKV tensor (B, T, H, 3 D + pad), rotated in place (as the
// transformer layer does since ABI 1.10), and X packed into a strided Y: both kernels
// against the f64 reference; every element outside the rotated rows keeps its value.
TEST(PointwiseEmulation, RopeStridedRows) {
  std::mt19937 rng(9);
  std::normal_distribution<double> nd(0.0, 1.0);
  Worst worst;
  for (DType dt : {DType::kBF16, DType::kF32})
    for (const RopeCase& c :
         {RopeCase{2, 5, 3, 64, 64}, RopeCase{1, 9, 4, 128, 96}, RopeCase{2, 3, 2, 20, 16}})
      for (int pad : {0, 3})
        for (int mode : {0, 1, 2})  // Y = X; Y a view with X's row pad; with the other pad
          for (bool generic : {false, true})
            for (bool bwd : {false, true}) {
              const bool in_place = mode == 0;
              const int ypad = mode == 2 ? 3 - pad : pad;
              const int64_t w = 3 * c.d + pad, wy = 3 * c.d + ypad, tokens = c.b * c.t;
              const int64_t numel = tokens * c.h * w, ynumel = tokens * c.h * wy;
              const std::vector<float> inv = inv_freqs(c.rot);
              std::vector<int32_t> pos(tokens);
              for (auto& p : pos) p = static_cast<int32_t>(rng() % 65537);
              Buf x(dt, numel, 0), x0(dt, numel, 0), y(dt, ynumel, 0), y0(dt, ynumel, 0);
              for (int64_t i = 0; i < numel; ++i) x0.set(i, nd(rng));
              for (int64_t i = 0; i < ynumel; ++i) y0.set(i, nd(rng));
              std::memcpy(x.p, x0.p, numel * dtype_size(dt));
              std::memcpy(y.p, y0.p, ynumel * dtype_size(dt));
              // X: k's columns [D, 2D) of the fused rows; Y: X itself, or columns [2D, 3D)
              // of another such tensor.
              const int64_t col = c.d, ycol = in_place ? c.d : 2 * c.d;
              Buf& out = in_place ? x : y;
              const Buf& before = in_place ? x0 : y0;
              const int64_t yw = in_place ? w : wy, out_numel = in_place ? numel : ynumel;
              Buf xv(dt, 0, 0), yv(dt, 0, 0), x0v(dt, 0, 0);  // views: no storage of their own
              xv.p = x.p + col * dtype_size(dt);
              yv.p = out.p + ycol * dtype_size(dt);
              x0v.p = x0.p + col * dtype_size(dt);
              const RopeStrides st{c.t * c.h * w, c.h * w, w, c.t * c.h * yw, c.h * yw, yw};
              const std::string what =
                  std::string(bwd ? "rope_bwd " : "rope_fwd ") + name(dt) + " D " +
                  std::to_string(c.d) + " rotary " + std::to_string(c.rot) + " pad " +
                  std::to_string(pad) +
                  (in_place ? " in place" : " into a view of pad " + std::to_string(ypad)) +
                  (generic ? " general" : "");
              const RopePlan p = run_rope(xv, pos.data(), inv.data(), yv, c, bwd, generic, &st);
              // 16-byte vectors only with every row of X and Y aligned.
              const int vw = static_cast<int>(16 / dtype_size(dt));
              if (!generic) {
                ASSERT_TRUE(p.typed) << what;
                const bool aligned = pad == 0 && ypad == 0;
                ASSERT_EQ(p.width, aligned && c.d % vw == 0 && c.rot / 2 % vw == 0 ? vw : 1)
                    << what;
              }
              worst.add(std::string("rope strided ") + name(dt) + (generic ? " general" : ""),
                        check_rope(x0v, pos.data(), inv, yv, c, bwd, what, &st));
              // Nothing outside Y's rows changed.
              int64_t changed = 0;
              for (int64_t i = 0; i < out_numel; ++i) {
                const int64_t cc = i % yw;
                if (cc >= ycol && cc < ycol + c.d) continue;
                if (out.get(i) != before.get(i)) ++changed;
              }
              EXPECT_EQ(changed, 0) << what << ": elements written outside Y's rows";
              if (HasFailure()) return;
            }
  worst.print();
}

// ---- split_qkv / merge_qkv's copy (qkv_kernel.cuh) ----------------------------------------

// Splits X (bt, g, (qpg + 2) * per_head units of U) into Q, K, V and merges them back, with
// both index types and a 2-block grid (the grid-stride loop), against the layout of
// loom/ops.h written out here: query slot s of group g of token t is query head
// t * H + g * qpg + s, the group's key and value heads are head t * G + g.
template <class U, class I>
void qkv_round_trip(int64_t bt, int64_t g, int64_t qpg, int64_t per_head) {
  const int64_t h = g * qpg, n = bt * g * (qpg + 2) * per_head;
  std::vector<U> x(n), q(bt * h * per_head), k(bt * g * per_head), v(bt * g * per_head), x2(n);
  std::vector<U> q_want(q.size()), k_want(k.size()), v_want(v.size());
  for (int64_t i = 0; i < n; ++i) {  // every unit distinct
    std::memset(&x[i], 0, sizeof(U));
    const uint32_t tag = static_cast<uint32_t>(i * 2654435761u + 1);
    std::memcpy(&x[i], &tag, std::min(sizeof(U), sizeof(tag)));
  }
  for (int64_t t = 0; t < bt; ++t)
    for (int64_t gi = 0; gi < g; ++gi)
      for (int64_t slot = 0; slot < qpg + 2; ++slot)
        for (int64_t u = 0; u < per_head; ++u) {
          const U& src = x[((t * g + gi) * (qpg + 2) + slot) * per_head + u];
          if (slot < qpg)
            q_want[(t * h + gi * qpg + slot) * per_head + u] = src;
          else
            (slot == qpg ? k_want : v_want)[(t * g + gi) * per_head + u] = src;
        }
  const std::string what = "bt " + std::to_string(bt) + " G " + std::to_string(g) + " H/G " +
                           std::to_string(qpg) + " units/head " + std::to_string(per_head) +
                           " unit " + std::to_string(sizeof(U)) + " index " +
                           std::to_string(sizeof(I) * 8);
  auto same = [](const std::vector<U>& a, const std::vector<U>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(U)) == 0;
  };
  for (bool merge : {false, true}) {
    emu::run_grid(2, kFlatThreads, [&] {
      qkv_copy_kernel<U, I>(merge ? x2.data() : x.data(), q.data(), k.data(), v.data(),
                            static_cast<I>(n), static_cast<I>(per_head), static_cast<I>(qpg),
                            merge);
    });
    if (!merge) {
      EXPECT_TRUE(same(q, q_want)) << "split Q, " << what;
      EXPECT_TRUE(same(k, k_want)) << "split K, " << what;
      EXPECT_TRUE(same(v, v_want)) << "split V, " << what;
    } else {
      EXPECT_TRUE(same(x2, x)) << "merge, " << what;
    }
  }
}

TEST(PointwiseEmulation, QkvSplitAndMerge) {
  struct Shape {
    int64_t bt, g, qpg, per_head;
  };
  // GPT-2's (MHA: one query head a group, a bf16 head of 64 = 8 units of 16 bytes), GQA,
  // MQA (one group), odd unit counts, a single token.
  for (const Shape& c : {Shape{7, 12, 1, 8}, Shape{5, 2, 3, 8}, Shape{3, 1, 4, 3},
                         Shape{4, 3, 2, 5}, Shape{1, 2, 2, 1}}) {
    qkv_round_trip<uint4, uint32_t>(c.bt, c.g, c.qpg, c.per_head);
    qkv_round_trip<uint4, int64_t>(c.bt, c.g, c.qpg, c.per_head);
    qkv_round_trip<uint16_t, uint32_t>(c.bt, c.g, c.qpg, c.per_head);
    qkv_round_trip<uint2, int64_t>(c.bt, c.g, c.qpg, c.per_head);
  }
}

}  // namespace
}  // namespace loom::kernels::cuda::pointwise
