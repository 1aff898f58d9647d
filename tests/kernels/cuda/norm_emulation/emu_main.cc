// Runs the warp-per-row norm kernels (kernels/cuda/pointwise/norm_warp.cuh) on the CPU under
// emulation (emu_prelude.h, emu_runner.h: one fiber per CUDA thread, shuffles through
// per-lane slots, barriers between fibers) and compares them with an f64 reference of
// loom/ops.h's layernorm / rmsnorm: the forward's Y = (x - mean) * rstd * (w + shift) + b,
// mean and rstd; the backward's dX, and dweight / dbias from the partial rows added in block
// order (as norm.cuh's finalize kernel), both ways: norm_wgrad_cols_kernel's rows and the
// dX kernel's own (kWgrad, the fused form, whose warps may stride over several rows or have
// none, and whose blocks add their warps in order through shared memory). Over every lane count
// the launchers pick, partial last vectors of a lane, grids smaller than the rows (the
// grid-stride loops), with and without bias and zero-centred gamma, in bf16, f16 and f32.
// Tolerance: the op tests' for the dtype (Y and dX rounded once to it).
//
// The residual-add forms (kAdd: add_layernorm_* / add_rmsnorm_*) on the same cases: Z must
// be round(x + r) bit for bit (f32 sum, one rounding), with Z in its own buffer, over X and
// over R; Y, mean and rstd are checked against the f64 reference of that ROUNDED Z, and must
// equal the plain kernel's on the stored Z bit for bit (a kernel that kept the unrounded sum
// for its statistics misses the f64 mean / rstd by up to ~100 times their 1e-5 tolerance in
// narrow rows, but by less than it in some wide f16 ones: the bitwise check catches it
// everywhere); the backward's dX against the f64 backward of Z plus dZ, and its weight
// gradients as the plain backward's of Z.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

// Device-only pieces for host C++: a block's __shared__ arrays become statics, which the
// fibers of the block (one block runs at a time) share; __fmul_rn is the plain product
// (the ISO C++ mode of the build contracts nothing).
#undef __shared__
#define __shared__ static
extern "C" float __fmul_rn(float x, float y) { return x * y; }

#include "kernels/cuda/pointwise/norm_warp.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"

namespace loom::kernels::cuda::pointwise {
namespace {

using emu::from_f;
using emu::to_f;

struct Case {
  int64_t rows, cols;
  unsigned grid;  // 0: the launcher's (rows / 8 blocks)
  bool bias;
  float shift;
};

// Where the residual-add forward writes Z: a buffer of its own, over X, or over R.
enum class ZAt { kOwn, kX, kR };
const char* z_at_name(ZAt z) { return z == ZAt::kOwn ? "" : z == ZAt::kX ? " Z=X" : " Z=R"; }

template <class T, bool kRms, int kVecs, bool kAdd>
void launch(const NormFwdWarpArgs<T>& a, unsigned grid) {
  emu::run_grid(grid, kWarpRowsPerBlock * 32,
                [&] { norm_fwd_warp_kernel<T, kRms, kVecs, kAdd>(a); });
}

// The launcher's choice of kVecs (norm.cuh's launch_norm_fwd_warp).
template <class T, bool kRms, bool kAdd>
void run_kernel(const NormFwdWarpArgs<T>& a, unsigned grid) {
  const int vecs = static_cast<int>((a.cols / 8 + 31) / 32);
  switch (vecs) {
    case 1:
      return launch<T, kRms, 1, kAdd>(a, grid);
    case 2:
      return launch<T, kRms, 2, kAdd>(a, grid);
    case 3:
      return launch<T, kRms, 3, kAdd>(a, grid);
    case 4:
      return launch<T, kRms, 4, kAdd>(a, grid);
    case 5:
    case 6:
      return launch<T, kRms, 6, kAdd>(a, grid);
    default:
      return launch<T, kRms, 8, kAdd>(a, grid);
  }
}

// The forward of one case; kAdd: of x + r, with Z where `z_at` says.
template <class T, bool kRms, bool kAdd = false>
void check(const Case& c, double rtol, double atol, std::mt19937& rng, ZAt z_at = ZAt::kOwn) {
  std::normal_distribution<float> nd(0.5f, 2.0f);
  const int64_t n = c.rows * c.cols;
  std::vector<T> x(n), y(n, from_f<T>(NAN)), w(c.cols), b(c.cols);
  for (auto& v : x) v = from_f<T>(nd(rng));
  for (auto& v : w) v = from_f<T>(0.3f * nd(rng));
  for (auto& v : b) v = from_f<T>(0.3f * nd(rng));
  // The norm's input (N, C): x, or kAdd's round(x + r) in f32 as the kernel must round it.
  std::vector<T> res, zbuf, zin = x;
  if (kAdd) {
    res.resize(n);
    for (auto& v : res) v = from_f<T>(nd(rng));
    for (int64_t i = 0; i < n; ++i) zin[i] = from_f<T>(to_f(x[i]) + to_f(res[i]));
    zbuf.assign(n, from_f<T>(NAN));
  }
  const std::vector<T> x0 = x, r0 = res;  // the inputs as given (Z may overwrite one)
  std::vector<float> mean(c.rows, NAN), rstd(c.rows, NAN);
  NormFwdWarpArgs<T> a{};
  a.x = x.data();
  if (kAdd) {
    a.r = res.data();
    a.z = z_at == ZAt::kX ? x.data() : z_at == ZAt::kR ? res.data() : zbuf.data();
  }
  a.w = w.data();
  a.b = !kRms && c.bias ? b.data() : nullptr;
  a.y = y.data();
  a.mean = kRms ? nullptr : mean.data();
  a.rstd = rstd.data();
  a.rows = c.rows;
  a.cols = c.cols;
  a.eps = 1e-5f;
  a.gamma_shift = c.shift;
  const unsigned grid =
      c.grid ? c.grid : static_cast<unsigned>((c.rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
  run_kernel<T, kRms, kAdd>(a, grid);
  const std::string what = std::string(kAdd ? "add_" : "") + (kRms ? "rmsnorm" : "layernorm") +
                           " rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) +
                           " grid " + std::to_string(grid) + (kAdd ? z_at_name(z_at) : "");
  if (kAdd) {
    const T* z = a.z;
    // The untouched input is as given; Z is round(x + r), bit for bit.
    if (z_at != ZAt::kX) {
      ASSERT_EQ(0, std::memcmp(x.data(), x0.data(), n * sizeof(T))) << what;
    }
    if (z_at != ZAt::kR) {
      ASSERT_EQ(0, std::memcmp(res.data(), r0.data(), n * sizeof(T))) << what;
    }
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(0, std::memcmp(&z[i], &zin[i], sizeof(T)))
          << what << ": Z[" << i << "] is " << to_f(z[i]) << ", expected round(" << to_f(x0[i])
          << " + " << to_f(r0[i]) << ") = " << to_f(zin[i]);
    // "Exactly as the plain forward of Z": the plain kernel on the stored Z gives the same
    // bits (the same arithmetic in the same order), a sharper check than the f64 one below.
    std::vector<T> y_plain(n, from_f<T>(NAN));
    std::vector<float> mean_plain(c.rows, NAN), rstd_plain(c.rows, NAN);
    NormFwdWarpArgs<T> p = a;
    p.x = zin.data();
    p.r = nullptr, p.z = nullptr;
    p.y = y_plain.data();
    p.mean = kRms ? nullptr : mean_plain.data();
    p.rstd = rstd_plain.data();
    run_kernel<T, kRms, false>(p, grid);
    ASSERT_EQ(0, std::memcmp(y.data(), y_plain.data(), n * sizeof(T)))
        << what << ": Y differs from the plain forward's of Z";
    if (!kRms) {
      ASSERT_EQ(0, std::memcmp(mean.data(), mean_plain.data(), c.rows * sizeof(float)))
          << what << ": mean differs from the plain forward's of Z";
    }
    ASSERT_EQ(0, std::memcmp(rstd.data(), rstd_plain.data(), c.rows * sizeof(float)))
        << what << ": rstd differs from the plain forward's of Z";
  }
  double worst = 0, worst_stat = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c.cols; ++j) mu += to_f(zin[r * c.cols + j]);
    mu = kRms ? 0.0 : mu / c.cols;
    for (int64_t j = 0; j < c.cols; ++j) {
      const double d = to_f(zin[r * c.cols + j]) - mu;
      var += d * d;
    }
    var /= c.cols;
    const double rs = 1.0 / std::sqrt(var + 1e-5);
    if (!kRms) {
      EXPECT_NEAR(mean[r], mu, 1e-5 * (1 + std::fabs(mu))) << what << " row " << r;
      worst_stat = std::max(worst_stat, std::fabs(mean[r] - mu) / (1e-5 * (1 + std::fabs(mu))));
    }
    EXPECT_NEAR(rstd[r], rs, 1e-5 * rs) << what << " row " << r;
    worst_stat = std::max(worst_stat, std::fabs(rstd[r] - rs) / (1e-5 * rs));
    for (int64_t j = 0; j < c.cols; ++j) {
      const double want =
          (to_f(zin[r * c.cols + j]) - mu) * rs * (to_f(w[j]) + c.shift) + (a.b ? to_f(b[j]) : 0.0);
      const double got = to_f(y[r * c.cols + j]);
      const double err = std::fabs(got - want);
      worst = std::max(worst, err / (atol + rtol * std::fabs(want)));
      ASSERT_LE(err, atol + rtol * std::fabs(want))
          << what << ": Y[" << r << ", " << j << "] is " << got << ", expected " << want;
    }
  }
  std::printf("[error] %s: worst Y |diff| / tolerance %.3g, mean / rstd %.3g\n", what.c_str(),
              worst, worst_stat);
}

template <class T, bool kRms, int kVecs, bool kAdd, bool kWgrad>
void launch_bwd(const NormBwdWarpArgs<T>& a, unsigned grid) {
  emu::run_grid(grid, kWarpRowsPerBlock * 32,
                [&] { norm_bwd_warp_kernel<T, kRms, kVecs, kAdd, kWgrad>(a); });
}

// The backward of one case: dX, then the weight gradients, whose partial rows are summed in
// block order here, as norm_wgrad_finalize_kernel does. Separate (kWgrad false): the cols
// kernel writes them; fused (kWgrad true): the dX kernel, one row per block of its grid
// (the case's, or 3 blocks: warps that stride over several rows and warps with none).
// kAdd: x is Z and dX also gets dZ.
template <class T, bool kRms, bool kAdd = false, bool kWgrad = false>
void check_bwd(const Case& c, double rtol, double atol, std::mt19937& rng) {
  if (c.cols > 256 * kWarpRowMaxBwdVecs) return;  // the general kernel's (norm.cuh)
  std::normal_distribution<float> nd(0.5f, 2.0f);
  const int64_t n = c.rows * c.cols;
  std::vector<T> x(n), dy(n), dx(n, from_f<T>(NAN)), w(c.cols), dz;
  for (auto& v : x) v = from_f<T>(nd(rng));
  for (auto& v : dy) v = from_f<T>(nd(rng));
  for (auto& v : w) v = from_f<T>(0.3f * nd(rng));
  if (kAdd) {
    dz.resize(n);
    for (auto& v : dz) v = from_f<T>(nd(rng));
  }
  // mean and rstd as the forward leaves them (f32).
  std::vector<float> mean(c.rows), rstd(c.rows);
  for (int64_t r = 0; r < c.rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c.cols; ++j) mu += to_f(x[r * c.cols + j]);
    mu = kRms ? 0.0 : mu / c.cols;
    for (int64_t j = 0; j < c.cols; ++j) var += std::pow(to_f(x[r * c.cols + j]) - mu, 2);
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(1.0 / std::sqrt(var / c.cols + 1e-5));
  }
  NormBwdWarpArgs<T> a{};
  a.dy = dy.data();
  a.x = x.data();
  a.dz = kAdd ? dz.data() : nullptr;
  a.w = w.data();
  a.mean = kRms ? nullptr : mean.data();
  a.rstd = rstd.data();
  a.dx = dx.data();
  a.rows = c.rows;
  a.cols = c.cols;
  a.gamma_shift = c.shift;
  const bool want_db = !kRms && c.bias;
  const int grads = want_db ? 2 : 1;
  // Separate: as many blocks as 8-row groups; fused: the case's grid or 3.
  const unsigned grid =
      c.grid   ? c.grid
      : kWgrad ? 3u
               : static_cast<unsigned>((c.rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
  const unsigned slices = c.grid ? c.grid : 3;  // partial rows: block rows, or the fused grid
  std::vector<float> partial(static_cast<size_t>(slices) * grads * c.cols, NAN);
  a.partial = partial.data();
  a.want_db = want_db;
  switch (static_cast<int>((c.cols / 8 + 31) / 32)) {
    case 1:
      launch_bwd<T, kRms, 1, kAdd, kWgrad>(a, grid);
      break;
    case 2:
      launch_bwd<T, kRms, 2, kAdd, kWgrad>(a, grid);
      break;
    case 3:
      launch_bwd<T, kRms, 3, kAdd, kWgrad>(a, grid);
      break;
    case 4:
      launch_bwd<T, kRms, 4, kAdd, kWgrad>(a, grid);
      break;
    case 5:
    case 6:
      launch_bwd<T, kRms, 6, kAdd, kWgrad>(a, grid);
      break;
    default:
      launch_bwd<T, kRms, 8, kAdd, kWgrad>(a, grid);
      break;
  }
  if (!kWgrad) {
    const unsigned xblocks = static_cast<unsigned>((c.cols / 8 + 31) / 32);
    emu::run_grid(
        xblocks, 256, [&] { norm_wgrad_cols_kernel<T, kRms>(a, want_db, partial.data()); }, slices);
  }
  const std::string what = std::string(kAdd ? "add_" : "") + (kRms ? "rmsnorm" : "layernorm") +
                           " backward rows " + std::to_string(c.rows) + " cols " +
                           std::to_string(c.cols) + (kWgrad ? " (fused weight gradients)" : "");
  std::vector<double> dw_ref(c.cols, 0.0), db_ref(c.cols, 0.0);
  double worst = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    double s0 = 0, s1 = 0;
    std::vector<double> xhat(c.cols), g(c.cols);
    for (int64_t j = 0; j < c.cols; ++j) {
      xhat[j] = (to_f(x[r * c.cols + j]) - static_cast<double>(mean[r])) * rstd[r];
      g[j] = static_cast<double>(to_f(dy[r * c.cols + j])) * (to_f(w[j]) + c.shift);
      s0 += g[j];
      s1 += g[j] * xhat[j];
      dw_ref[j] += to_f(dy[r * c.cols + j]) * xhat[j];
      db_ref[j] += to_f(dy[r * c.cols + j]);
    }
    const double mg = kRms ? 0.0 : s0 / c.cols, mgx = s1 / c.cols;
    for (int64_t j = 0; j < c.cols; ++j) {
      const double want = rstd[r] * (g[j] - mg - xhat[j] * mgx) +
                          (kAdd ? to_f(dz[r * c.cols + j]) : 0.0),
                   got = to_f(dx[r * c.cols + j]);
      const double err = std::fabs(got - want);
      worst = std::max(worst, err / (atol + rtol * std::fabs(want)));
      ASSERT_LE(err, atol + rtol * std::fabs(want))
          << what << ": dX[" << r << ", " << j << "] is " << got << ", expected " << want;
    }
  }
  // The weight gradients are f32 sums: f32 tolerance relative to the sum of |terms|.
  for (int gi = 0; gi < grads; ++gi)
    for (int64_t j = 0; j < c.cols; ++j) {
      double got = 0;
      for (unsigned by = 0; by < slices; ++by) got += partial[(by * grads + gi) * c.cols + j];
      const double want = gi == 0 ? dw_ref[j] : db_ref[j];
      double mag = 0;
      for (int64_t r = 0; r < c.rows; ++r) mag += std::fabs(to_f(dy[r * c.cols + j])) * 4;
      ASSERT_NEAR(got, want, 1e-5 * (mag + 1))
          << what << ": " << (gi == 0 ? "dweight" : "dbias") << "[" << j << "]";
    }
  std::printf("[error] %s: worst dX |diff| / tolerance %.3g\n", what.c_str(), worst);
}

std::vector<Case> cases() {
  return {
      {1, 8, 0, true, 0.f},      // one vector: lane 0 alone
      {5, 248, 0, true, 0.f},    // 31 vectors: lane 31 idle
      {9, 264, 0, false, 1.f},   // 33 vectors: 2 a lane, one lane with a second
      {19, 768, 0, true, 0.f},   // GPT-2: 3 a lane
      {19, 768, 1, true, 0.f},   // one block strides over 19 rows
      {3, 1032, 0, true, 1.f},   // 129 vectors: the 6-vector kernel with a partial last
      {4, 2048, 2, false, 0.f},  // LLaMA width: 8 a lane
  };
}

// The op tests' tolerances (tests/kernels/cpu/op_test_util.h): one rounding of Y.
TEST(NormWarpEmulation, LayerNormBf16) {
  std::mt19937 rng(1);
  for (const Case& c : cases()) check<__nv_bfloat16, false>(c, 1.6e-2, 1e-2, rng);
  for (const Case& c : cases()) {
    check_bwd<__nv_bfloat16, false>(c, 1.6e-2, 1e-2, rng);
    check_bwd<__nv_bfloat16, false, false, true>(c, 1.6e-2, 1e-2, rng);
  }
}
TEST(NormWarpEmulation, LayerNormF16) {
  std::mt19937 rng(2);
  for (const Case& c : cases()) check<__half, false>(c, 2e-3, 1e-3, rng);
  for (const Case& c : cases()) {
    check_bwd<__half, false>(c, 2e-3, 1e-3, rng);
    check_bwd<__half, false, false, true>(c, 2e-3, 1e-3, rng);
  }
}
TEST(NormWarpEmulation, LayerNormF32) {
  std::mt19937 rng(9);
  for (const Case& c : cases()) check<float, false>(c, 1e-4, 1e-5, rng);
  for (const Case& c : cases()) {
    check_bwd<float, false>(c, 1e-4, 1e-5, rng);
    check_bwd<float, false, false, true>(c, 1e-4, 1e-5, rng);
  }
}
TEST(NormWarpEmulation, RmsNormBf16) {
  std::mt19937 rng(3);
  for (const Case& c : cases()) check<__nv_bfloat16, true>(c, 1.6e-2, 1e-2, rng);
  for (const Case& c : cases()) {
    check_bwd<__nv_bfloat16, true>(c, 1.6e-2, 1e-2, rng);
    check_bwd<__nv_bfloat16, true, false, true>(c, 1.6e-2, 1e-2, rng);
  }
}
TEST(NormWarpEmulation, RmsNormF16) {
  std::mt19937 rng(4);
  for (const Case& c : cases()) check<__half, true>(c, 2e-3, 1e-3, rng);
  for (const Case& c : cases()) {
    check_bwd<__half, true>(c, 2e-3, 1e-3, rng);
    check_bwd<__half, true, false, true>(c, 2e-3, 1e-3, rng);
  }
}

TEST(NormWarpEmulation, RmsNormF32) {
  std::mt19937 rng(10);
  for (const Case& c : cases()) check<float, true>(c, 1e-4, 1e-5, rng);
  for (const Case& c : cases()) {
    check_bwd<float, true>(c, 1e-4, 1e-5, rng);
    check_bwd<float, true, false, true>(c, 1e-4, 1e-5, rng);
  }
}

// The residual-add forms: every case with Z in its own buffer, over X and over R.
template <class T, bool kRms>
void check_add_norm(double rtol, double atol, std::mt19937& rng) {
  for (const Case& c : cases())
    for (ZAt z_at : {ZAt::kOwn, ZAt::kX, ZAt::kR}) check<T, kRms, true>(c, rtol, atol, rng, z_at);
  for (const Case& c : cases()) {
    check_bwd<T, kRms, true>(c, rtol, atol, rng);
    check_bwd<T, kRms, true, true>(c, rtol, atol, rng);
  }
}
TEST(NormWarpEmulation, AddLayerNormBf16) {
  std::mt19937 rng(5);
  check_add_norm<__nv_bfloat16, false>(1.6e-2, 1e-2, rng);
}
TEST(NormWarpEmulation, AddLayerNormF16) {
  std::mt19937 rng(6);
  check_add_norm<__half, false>(2e-3, 1e-3, rng);
}
TEST(NormWarpEmulation, AddRmsNormBf16) {
  std::mt19937 rng(7);
  check_add_norm<__nv_bfloat16, true>(1.6e-2, 1e-2, rng);
}
TEST(NormWarpEmulation, AddRmsNormF16) {
  std::mt19937 rng(8);
  check_add_norm<__half, true>(2e-3, 1e-3, rng);
}
TEST(NormWarpEmulation, AddLayerNormF32) {
  std::mt19937 rng(11);
  check_add_norm<float, false>(1e-4, 1e-5, rng);
}
TEST(NormWarpEmulation, AddRmsNormF32) {
  std::mt19937 rng(12);
  check_add_norm<float, true>(1e-4, 1e-5, rng);
}

}  // namespace
}  // namespace loom::kernels::cuda::pointwise
