// Runs the CUDA Mamba-2 kernels (kernels/cuda/mamba/*_kernel.cuh) on the CPU under emulation
// (tests/kernels/cuda/emulation/emu_prelude.h: one fiber per CUDA thread, switched
// at barriers and warp collectives in a shuffled order) and compares them with f64 references
// written here from loom/ops/mamba.h: the forwards step by step, the gradients by central
// differences of the f64 forwards. f32 storage (the dtype conversions are the shared
// dtype.cuh's). The launch geometry is repeated from the launchers (*.cu), which cannot be
// compiled without nvcc. Usage: run.sh (from the repository root).
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "kernels/cuda/mamba/causal_conv1d_kernel.cuh"
#include "kernels/cuda/mamba/rmsnorm_gated_kernel.cuh"
#include "kernels/cuda/mamba/ssd_scan_kernel.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"

namespace loom::kernels::cuda::mamba {
alignas(16) float mamba_smem[64 * 1024];
}  // namespace loom::kernels::cuda::mamba

using namespace loom::kernels::cuda::mamba;
using Vec = std::vector<double>;
using FVec = std::vector<float>;

namespace emu {
// The attention emulation's scheduler, with this test's shared memory set to NaN before each
// block (a kernel that reads shared memory it did not write gets NaN).
inline void run_poisoned(dim3 grid, unsigned block, std::function<void()> body) {
  run_grid(grid, block, std::move(body),
           [] { std::fill(std::begin(mamba_smem), std::end(mamba_smem), std::nanf("")); });
}
}  // namespace emu

int g_fail = 0;
std::mt19937 g_rng(7);

FVec rnd(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  FVec v(n);
  for (float& x : v) x = u(g_rng);
  return v;
}
Vec to_d(const FVec& v) { return Vec(v.begin(), v.end()); }

void compare(const std::string& what, const FVec& got, const Vec& want, double rtol = 2e-4) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  double worst = 0;
  size_t wi = 0, bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double r = std::fabs(got[i] - want[i]) / (rtol * (scale + 1e-3) + rtol * std::fabs(want[i]));
    if (std::isnan(got[i])) r = 1e9;
    if (r > 1) ++bad;
    if (r > worst) worst = r, wi = i;
  }
  printf("  %-28s worst err/tol %.3f%s (at %zu: got %.7g want %.7g) n=%zu\n", what.c_str(), worst,
         bad ? "  FAIL" : "", wi, want.empty() ? 0.0 : got[wi], want.empty() ? 0.0 : want[wi],
         want.size());
  if (bad) ++g_fail;
}

// Gradient of sum(w * f(x)) by central differences of the f64 forward f over x.
Vec fd(Vec& x, const Vec& w, const std::function<Vec()>& f, double eps = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + eps;
    Vec up = f();
    x[i] = x0 - eps;
    Vec dn = f();
    x[i] = x0;
    double s = 0;
    for (size_t k = 0; k < w.size(); ++k) s += w[k] * (up[k] - dn[k]);
    g[i] = s / (2 * eps);
  }
  return g;
}

// ---- causal_conv1d -----------------------------------------------------------------------

Vec conv_ref(const Vec& x, const Vec& w, const Vec* bias, const Vec* init, int64_t B, int64_t T,
             int64_t C, int W, int act, Vec* fin) {
  auto xe = [&](int64_t b, int64_t s, int64_t c) -> double {
    if (s >= 0) return x[(b * T + s) * C + c];
    return init ? (*init)[(b * (W - 1) + W - 1 + s) * C + c] : 0.0;
  };
  Vec y(B * T * C);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double u = bias ? (*bias)[c] : 0.0;
        for (int j = 0; j < W; ++j) u += w[c * W + j] * xe(b, t + j - (W - 1), c);
        y[(b * T + t) * C + c] = act ? u / (1 + std::exp(-u)) : u;
      }
  if (fin) {
    fin->assign(B * (W - 1) * C, 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int k = 0; k < W - 1; ++k)
        for (int64_t c = 0; c < C; ++c)
          (*fin)[(b * (W - 1) + k) * C + c] = xe(b, T - (W - 1) + k, c);
  }
  return y;
}

template <int kW>
void conv_case(int64_t B, int64_t T, int64_t C, int act, bool has_bias, bool has_init) {
  printf("causal_conv1d B=%ld T=%ld C=%ld W=%d act=%d bias=%d init=%d\n", B, T, C, kW, act,
         has_bias, has_init);
  FVec x = rnd(B * T * C, -1, 1), w = rnd(C * kW, -1, 1), bias = rnd(C, -1, 1),
       init = rnd(B * (kW - 1) * C, -1, 1), dy = rnd(B * T * C, -1, 1);
  FVec y(B * T * C), fin(B * (kW - 1) * C), dx(B * T * C, NAN), dw(C * kW, 0.5f), db(C, 0.25f);
  ConvArgs a{};
  a.x = x.data(), a.w = w.data(), a.bias = has_bias ? bias.data() : nullptr;
  a.init = has_init ? init.data() : nullptr;
  a.y = y.data(), a.fin = fin.data(), a.b = B, a.t = T, a.c = C, a.act = act;
  const unsigned g1 = static_cast<unsigned>(std::min<int64_t>((B * T * C + 255) / 256, 3));
  emu::run_poisoned(dim3(g1), kConvThreads, [&] { causal_conv1d_fwd_kernel<float, kW>(a); });
  if (kW > 1)
    emu::run_poisoned(dim3(2), kConvThreads, [&] { causal_conv1d_state_kernel<float, kW>(a); });
  Vec xd = to_d(x), wd = to_d(w), bd = to_d(bias), id = to_d(init), find;
  Vec want =
      conv_ref(xd, wd, has_bias ? &bd : nullptr, has_init ? &id : nullptr, B, T, C, kW, act, &find);
  compare("y", y, want);
  if (kW > 1) compare("final_state", fin, find, 1e-6);
  ConvArgs g = a;
  g.dy = dy.data(), g.y = dx.data(), g.fin = nullptr, g.dw = dw.data();
  g.db = has_bias ? db.data() : nullptr;
  const int64_t steps = 8 * kConvTile;
  emu::run_poisoned(dim3((C + 31) / 32, (T + steps - 1) / steps, B), kConvThreads,
                    [&] { causal_conv1d_bwd_kernel<float, kW>(g); });
  Vec dyd = to_d(dy);
  auto f = [&] {
    return conv_ref(xd, wd, has_bias ? &bd : nullptr, has_init ? &id : nullptr, B, T, C, kW, act,
                    nullptr);
  };
  compare("dx", dx, fd(xd, dyd, f));
  Vec gw = fd(wd, dyd, f);
  for (double& v : gw) v += 0.5;
  compare("dweight (+= 0.5)", dw, gw);
  if (has_bias) {
    Vec gb = fd(bd, dyd, f);
    for (double& v : gb) v += 0.25;
    compare("dbias (+= 0.25)", db, gb);
  }
}

// ---- rmsnorm_gated -----------------------------------------------------------------------

Vec gated_ref(const Vec& y, const Vec& z, const Vec& w, int64_t N, int64_t C, int64_t gs,
              double eps, Vec* rstd) {
  Vec out(N * C);
  if (rstd) rstd->assign(N * (C / gs), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g0 = 0; g0 < C; g0 += gs) {
      double ss = 0;
      for (int64_t k = 0; k < gs; ++k) {
        double zz = z[n * C + g0 + k], g = y[n * C + g0 + k] * zz / (1 + std::exp(-zz));
        ss += g * g;
      }
      double r = 1 / std::sqrt(ss / gs + eps);
      if (rstd) (*rstd)[n * (C / gs) + g0 / gs] = r;
      for (int64_t k = 0; k < gs; ++k) {
        double zz = z[n * C + g0 + k], g = y[n * C + g0 + k] * zz / (1 + std::exp(-zz));
        out[n * C + g0 + k] = g * r * w[g0 + k];
      }
    }
  return out;
}

void gated_case(int64_t N, int64_t C, int64_t gs) {
  printf("rmsnorm_gated N=%ld C=%ld group_size=%ld\n", N, C, gs);
  const float eps = 1e-5f;
  FVec y = rnd(N * C, -2, 2), z = rnd(N * C, -3, 3), w = rnd(C, 0.5, 1.5), dout = rnd(N * C, -1, 1);
  FVec out(N * C), rstd(N * (C / gs)), dy(N * C), dz(N * C), dw(C, 0.5f);
  GatedArgs a{};
  a.y = y.data(), a.z = z.data(), a.w = w.data(), a.rstd = rstd.data(), a.out = out.data();
  a.n = N, a.c = C, a.gs = gs, a.eps = eps;
  emu::run_poisoned(dim3(2), kGatedThreads, [&] { rmsnorm_gated_fwd_kernel<float>(a); });
  Vec yd = to_d(y), zd = to_d(z), wd = to_d(w), rd;
  compare("out", out, gated_ref(yd, zd, wd, N, C, gs, eps, &rd));
  compare("rstd", rstd, rd);
  GatedArgs g = a;
  g.dout = dout.data(), g.out = dy.data(), g.dz = dz.data(), g.dw = dw.data();
  emu::run_poisoned(dim3(2), kGatedThreads, [&] { rmsnorm_gated_bwd_kernel<float>(g); });
  emu::run_poisoned(dim3((C + 31) / 32, 2), kGatedThreads,
                    [&] { rmsnorm_gated_wgrad_kernel<float>(g); });
  Vec dd = to_d(dout);
  auto f = [&] { return gated_ref(yd, zd, wd, N, C, gs, eps, nullptr); };
  compare("dy", dy, fd(yd, dd, f));
  compare("dz", dz, fd(zd, dd, f));
  Vec gw = fd(wd, dd, f);
  for (double& v : gw) v += 0.5;
  compare("dweight (+= 0.5)", dw, gw);
}

// ---- ssd_scan ----------------------------------------------------------------------------

struct Ssd {
  int64_t B, T, H, P, G, N;
  int chunk, softplus;
  bool has_d, has_bias, has_init;
};

// y (B, T, H, P) and, when fin, the final state, step by step in f64.
Vec ssd_ref(const Ssd& c, const Vec& xbc, const Vec& dt_in, const Vec& a_log, const Vec& D,
            const Vec& bias, const Vec& init, Vec* fin) {
  const int64_t HG = c.H / c.G, gw = HG * c.P + 2 * c.N, cc = c.G * gw;
  Vec y(c.B * c.T * c.H * c.P);
  if (fin) fin->assign(c.B * c.H * c.P * c.N, 0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = h / HG;
      Vec S(c.P * c.N, 0);
      if (c.has_init)
        for (int64_t i = 0; i < c.P * c.N; ++i) S[i] = init[(b * c.H + h) * c.P * c.N + i];
      const double A = -std::exp(a_log[h]);
      for (int64_t t = 0; t < c.T; ++t) {
        double dt = dt_in[(b * c.T + t) * c.H + h] + (c.has_bias ? bias[h] : 0);
        if (c.softplus && dt <= 20) dt = std::log1p(std::exp(dt));
        const double dec = std::exp(dt * A);
        const double* row = &xbc[(b * c.T + t) * cc + g * gw];
        const double *x = row + (h % HG) * c.P, *Bv = row + HG * c.P, *Cv = Bv + c.N;
        for (int64_t p = 0; p < c.P; ++p) {
          double acc = 0;
          for (int64_t n = 0; n < c.N; ++n) {
            double& s = S[p * c.N + n];
            s = dec * s + dt * x[p] * Bv[n];
            acc += s * Cv[n];
          }
          y[((b * c.T + t) * c.H + h) * c.P + p] = acc + (c.has_d ? D[h] : 0) * x[p];
        }
      }
      if (fin)
        for (int64_t i = 0; i < c.P * c.N; ++i) (*fin)[(b * c.H + h) * c.P * c.N + i] = S[i];
    }
  return y;
}

void ssd_case(const Ssd& c) {
  printf("ssd_scan B=%ld T=%ld H=%ld P=%ld G=%ld N=%ld chunk=%d softplus=%d D=%d bias=%d init=%d\n",
         c.B, c.T, c.H, c.P, c.G, c.N, c.chunk, c.softplus, c.has_d, c.has_bias, c.has_init);
  const int64_t HG = c.H / c.G, gw = HG * c.P + 2 * c.N;
  FVec xbc = rnd(c.B * c.T * c.G * gw, -1, 1);
  FVec dt_in = c.softplus ? rnd(c.B * c.T * c.H, -2, 1) : rnd(c.B * c.T * c.H, 0.05f, 0.6f);
  FVec a_log = rnd(c.H, -1, 1), D = rnd(c.H, -1, 1), bias = rnd(c.H, -0.5, 0.5);
  FVec init = rnd(c.B * c.H * c.P * c.N, -1, 1), dy = rnd(c.B * c.T * c.H * c.P, -1, 1);
  FVec state0 = init;  // also the final state: the aliasing call
  FVec y(c.B * c.T * c.H * c.P);
  const int chunks = static_cast<int>((c.T + c.chunk - 1) / c.chunk);
  SsdArgs a{};
  a.xbc = xbc.data(), a.dt_in = dt_in.data(), a.a_log = a_log.data();
  a.d = c.has_d ? D.data() : nullptr, a.dt_bias = c.has_bias ? bias.data() : nullptr;
  a.init = c.has_init ? state0.data() : nullptr;
  FVec fin_sep(c.B * c.H * c.P * c.N);
  a.y = y.data(), a.fin = c.has_init ? state0.data() : fin_sep.data();
  a.b = c.B, a.t = c.T, a.h = c.H, a.p = c.P, a.g = c.G, a.n = c.N, a.hg = HG;
  a.chunk = c.chunk, a.chunks = chunks, a.softplus = c.softplus;
  if (ssd_smem(c.chunk, c.N, true).total > 64 * 1024) {
    printf("  shared memory too large for the emulation\n");
    ++g_fail;
    return;
  }
  const dim3 grid((c.P + kSsdTileP - 1) / kSsdTileP, c.H, c.B);
  emu::run_poisoned(grid, kSsdThreads, [&] { ssd_scan_fwd_kernel<float>(a); });
  Vec xd = to_d(xbc), dtd = to_d(dt_in), ad = to_d(a_log), Dd = to_d(D), bd = to_d(bias),
      id = to_d(init), find;
  compare("y", y, ssd_ref(c, xd, dtd, ad, Dd, bd, id, &find));
  compare(c.has_init ? "final_state (aliasing init)" : "final_state", c.has_init ? state0 : fin_sep,
          find);

  // Backward: the state pass, the reverse pass, the finish kernels.
  FVec states(c.B * c.H * chunks * c.P * c.N), dbc(c.B * c.T * c.G * 2 * c.N, 0.0f),
      ddt(c.B * c.T * c.H, 0.0f);
  FVec dxbc(xbc.size(), NAN), ddt_in(dt_in.size(), NAN), da_log(c.H, 0.5f), dD(c.H, 0.25f),
      ddt_bias(c.H, -0.5f);
  SsdArgs g = a;
  g.init = c.has_init ? init.data() : nullptr;
  g.y = nullptr, g.fin = nullptr, g.states = states.data();
  emu::run_poisoned(grid, kSsdThreads, [&] { ssd_scan_fwd_kernel<float>(g); });
  g.states = states.data(), g.dy = dy.data(), g.dxbc = dxbc.data(), g.dbc = dbc.data();
  g.ddt = ddt.data(), g.ddt_in = ddt_in.data(), g.da_log = da_log.data();
  g.dd = c.has_d ? dD.data() : nullptr;
  emu::run_poisoned(grid, kSsdThreads, [&] { ssd_scan_bwd_kernel<float>(g); });
  emu::run_poisoned(dim3(3), kSsdThreads, [&] { ssd_scan_bwd_finish_kernel<float>(g); });
  if (c.has_bias)
    emu::run_poisoned(dim3(c.H), kSsdThreads,
                      [&] { ssd_scan_bias_grad_kernel(g.ddt, c.B * c.T, c.H, ddt_bias.data()); });
  Vec dyd = to_d(dy);
  auto f = [&] { return ssd_ref(c, xd, dtd, ad, Dd, bd, id, nullptr); };
  compare("dxBC", dxbc, fd(xd, dyd, f), 5e-4);
  compare("ddt_in", ddt_in, fd(dtd, dyd, f), 5e-4);
  Vec ga = fd(ad, dyd, f);
  for (double& v : ga) v += 0.5;
  compare("dA_log (+= 0.5)", da_log, ga, 5e-4);
  if (c.has_d) {
    Vec gd = fd(Dd, dyd, f);
    for (double& v : gd) v += 0.25;
    compare("dD (+= 0.25)", dD, gd, 5e-4);
  }
  if (c.has_bias) {
    Vec gb = fd(bd, dyd, f);
    for (double& v : gb) v -= 0.5;
    compare("ddt_bias (+= -0.5)", ddt_bias, gb, 5e-4);
  }
}

int main() {
  conv_case<4>(2, 45, 40, 1, true, true);
  conv_case<4>(1, 300, 33, 0, false, false);
  conv_case<1>(2, 7, 5, 1, true, false);
  conv_case<3>(1, 1, 9, 1, false, true);
  conv_case<8>(1, 20, 3, 1, true, true);
  gated_case(5, 96, 48);
  gated_case(3, 40, 40);
  gated_case(4, 6, 1);
  ssd_case({2, 37, 4, 20, 2, 6, 8, 1, true, true, true});
  ssd_case({1, 21, 2, 3, 1, 5, 64, 0, false, false, false});
  ssd_case({1, 9, 3, 17, 3, 4, 1, 1, true, false, true});
  ssd_case({1, 70, 2, 4, 2, 3, 16, 1, false, true, false});
  printf(g_fail ? "FAILED: %d comparisons\n" : "PASSED\n", g_fail);
  return g_fail ? 1 : 0;
}
