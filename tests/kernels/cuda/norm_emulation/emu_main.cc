// Runs the warp-per-row norm kernels (kernels/cuda/pointwise/norm_warp.cuh) on the CPU under
// emulation (emu_prelude.h, emu_runner.h: one fiber per CUDA thread, shuffles through
// per-lane slots, barriers between fibers) and compares them with an f64 reference of
// loom/ops.h's layernorm / rmsnorm: the forward's Y = (x - mean) * rstd * (w + shift) + b,
// mean and rstd; the backward's dX, and dweight / dbias from norm_wgrad_cols_kernel's
// partial rows added in block order (as norm.cuh's finalize kernel). Over every lane count
// the launchers pick, partial last vectors of a lane, grids smaller than the rows (the
// grid-stride loops), with and without bias and zero-centred gamma, in bf16 and f16.
// Tolerance: the op tests' for the dtype (Y and dX rounded once to it).
#include <gtest/gtest.h>

#include <cmath>
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
#include "tests/kernels/cuda/attention_emulation/emu_runner.h"

namespace loom::kernels::cuda::pointwise {
namespace {

template <class T>
float to_f(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return __half2float(v);
}
template <class T>
T from_f(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return __float2half_rn(v);
}

struct Case {
  int64_t rows, cols;
  unsigned grid;  // 0: the launcher's (rows / 8 blocks)
  bool bias;
  float shift;
};

template <class T, bool kRms, int kVecs>
void launch(const NormFwdWarpArgs<T>& a, unsigned grid) {
  emu::run_grid(grid, kWarpRowsPerBlock * 32, [&] { norm_fwd_warp_kernel<T, kRms, kVecs>(a); });
}

// The launcher's choice of kVecs (norm.cuh's launch_norm_fwd_warp).
template <class T, bool kRms>
void run_kernel(const NormFwdWarpArgs<T>& a, unsigned grid) {
  const int vecs = static_cast<int>((a.cols / 8 + 31) / 32);
  switch (vecs) {
    case 1:
      return launch<T, kRms, 1>(a, grid);
    case 2:
      return launch<T, kRms, 2>(a, grid);
    case 3:
      return launch<T, kRms, 3>(a, grid);
    case 4:
      return launch<T, kRms, 4>(a, grid);
    case 5:
    case 6:
      return launch<T, kRms, 6>(a, grid);
    default:
      return launch<T, kRms, 8>(a, grid);
  }
}

template <class T, bool kRms>
void check(const Case& c, double rtol, double atol, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.5f, 2.0f);
  const int64_t n = c.rows * c.cols;
  std::vector<T> x(n), y(n, from_f<T>(NAN)), w(c.cols), b(c.cols);
  for (auto& v : x) v = from_f<T>(nd(rng));
  for (auto& v : w) v = from_f<T>(0.3f * nd(rng));
  for (auto& v : b) v = from_f<T>(0.3f * nd(rng));
  std::vector<float> mean(c.rows, NAN), rstd(c.rows, NAN);
  NormFwdWarpArgs<T> a{};
  a.x = x.data();
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
  run_kernel<T, kRms>(a, grid);
  const std::string what = std::string(kRms ? "rmsnorm" : "layernorm") + " rows " +
                           std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " grid " +
                           std::to_string(grid);
  double worst = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c.cols; ++j) mu += to_f(x[r * c.cols + j]);
    mu = kRms ? 0.0 : mu / c.cols;
    for (int64_t j = 0; j < c.cols; ++j) {
      const double d = to_f(x[r * c.cols + j]) - mu;
      var += d * d;
    }
    var /= c.cols;
    const double rs = 1.0 / std::sqrt(var + 1e-5);
    if (!kRms) {
      EXPECT_NEAR(mean[r], mu, 1e-5 * (1 + std::fabs(mu))) << what << " row " << r;
    }
    EXPECT_NEAR(rstd[r], rs, 1e-5 * rs) << what << " row " << r;
    for (int64_t j = 0; j < c.cols; ++j) {
      const double want =
          (to_f(x[r * c.cols + j]) - mu) * rs * (to_f(w[j]) + c.shift) + (a.b ? to_f(b[j]) : 0.0);
      const double got = to_f(y[r * c.cols + j]);
      const double err = std::fabs(got - want);
      worst = std::max(worst, err / (atol + rtol * std::fabs(want)));
      ASSERT_LE(err, atol + rtol * std::fabs(want))
          << what << ": Y[" << r << ", " << j << "] is " << got << ", expected " << want;
    }
  }
  std::printf("[error] %s: worst |diff| / tolerance %.3g\n", what.c_str(), worst);
}

template <class T, bool kRms, int kVecs>
void launch_bwd(const NormBwdWarpArgs<T>& a, unsigned grid) {
  emu::run_grid(grid, kWarpRowsPerBlock * 32, [&] { norm_bwd_warp_kernel<T, kRms, kVecs>(a); });
}

// The backward of one case: dX, then the weight gradients (cols kernel, then the partial
// rows summed in block order here, as norm_wgrad_finalize_kernel does).
template <class T, bool kRms>
void check_bwd(const Case& c, double rtol, double atol, std::mt19937& rng) {
  if (c.cols > 256 * kWarpRowMaxBwdVecs) return;  // the general kernel's (norm.cuh)
  std::normal_distribution<float> nd(0.5f, 2.0f);
  const int64_t n = c.rows * c.cols;
  std::vector<T> x(n), dy(n), dx(n, from_f<T>(NAN)), w(c.cols);
  for (auto& v : x) v = from_f<T>(nd(rng));
  for (auto& v : dy) v = from_f<T>(nd(rng));
  for (auto& v : w) v = from_f<T>(0.3f * nd(rng));
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
  a.w = w.data();
  a.mean = kRms ? nullptr : mean.data();
  a.rstd = rstd.data();
  a.dx = dx.data();
  a.rows = c.rows;
  a.cols = c.cols;
  a.gamma_shift = c.shift;
  const unsigned grid =
      c.grid ? c.grid : static_cast<unsigned>((c.rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
  switch (static_cast<int>((c.cols / 8 + 31) / 32)) {
    case 1:
      launch_bwd<T, kRms, 1>(a, grid);
      break;
    case 2:
      launch_bwd<T, kRms, 2>(a, grid);
      break;
    case 3:
      launch_bwd<T, kRms, 3>(a, grid);
      break;
    default:
      launch_bwd<T, kRms, 4>(a, grid);
      break;
  }
  const bool want_db = !kRms && c.bias;
  const int grads = want_db ? 2 : 1;
  const unsigned slices = c.grid ? c.grid : 3;  // block rows: several, or the case's grid
  const unsigned xblocks = static_cast<unsigned>((c.cols / 8 + 31) / 32);
  std::vector<float> partial(static_cast<size_t>(slices) * grads * c.cols, NAN);
  emu::run_grid(
      xblocks, 256, [&] { norm_wgrad_cols_kernel<T, kRms>(a, want_db, partial.data()); }, slices);
  const std::string what = std::string(kRms ? "rmsnorm" : "layernorm") + " backward rows " +
                           std::to_string(c.rows) + " cols " + std::to_string(c.cols);
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
      const double want = rstd[r] * (g[j] - mg - xhat[j] * mgx), got = to_f(dx[r * c.cols + j]);
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
  for (const Case& c : cases()) check_bwd<__nv_bfloat16, false>(c, 1.6e-2, 1e-2, rng);
}
TEST(NormWarpEmulation, LayerNormF16) {
  std::mt19937 rng(2);
  for (const Case& c : cases()) check<__half, false>(c, 2e-3, 1e-3, rng);
  for (const Case& c : cases()) check_bwd<__half, false>(c, 2e-3, 1e-3, rng);
}
TEST(NormWarpEmulation, RmsNormBf16) {
  std::mt19937 rng(3);
  for (const Case& c : cases()) check<__nv_bfloat16, true>(c, 1.6e-2, 1e-2, rng);
  for (const Case& c : cases()) check_bwd<__nv_bfloat16, true>(c, 1.6e-2, 1e-2, rng);
}
TEST(NormWarpEmulation, RmsNormF16) {
  std::mt19937 rng(4);
  for (const Case& c : cases()) check<__half, true>(c, 2e-3, 1e-3, rng);
  for (const Case& c : cases()) check_bwd<__half, true>(c, 2e-3, 1e-3, rng);
}

}  // namespace
}  // namespace loom::kernels::cuda::pointwise
