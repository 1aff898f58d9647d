// The Mamba-2 ops (loom/ops/mamba.h): causal_conv1d, ssd_scan and rmsnorm_gated with their
// gradients. The reference kernels against f64 oracles written here from the header's
// formulas (ssd_scan: the recurrence one step at a time) on odd shapes in every float dtype;
// both kernels' gradients against central differences of the oracles; cpu.fast (ssd_scan:
// the chunked form, chunk sizes that do not divide T) against cpu.ref; decoding in pieces
// (the final state of one call as the initial state of the next) against one call; and the
// words of bad calls. The fast-vs-reference checks also run every device backend linked in.
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

using Vec = std::vector<double>;

// An optional input: random values when `on`, else empty.
Tensor maybe(bool on, DType dt, std::vector<int64_t> shape, std::mt19937& rng, double lo = -1.0,
             double hi = 1.0) {
  return on ? Tensor::random(dt, std::move(shape), rng, lo, hi) : Tensor();
}
Vec vals(const Tensor& t) { return t.empty() ? Vec{} : t.values(); }

// d/dv_i of sum_k w_k f()_k by central differences in f64; f reads v.
Vec fd_grad(Vec& v, const Vec& w, const std::function<Vec()>& f, double eps = 1e-6) {
  Vec g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double v0 = v[i];
    double l[2] = {0.0, 0.0};
    for (int side = 0; side < 2; ++side) {
      v[i] = v0 + (side ? -eps : eps);
      const Vec y = f();
      for (size_t k = 0; k < y.size(); ++k) l[side] += w[k] * y[k];
    }
    v[i] = v0;
    g[i] = (l[0] - l[1]) / (2 * eps);
  }
  return g;
}

// Expected value of a "+=" output: its initial values plus the gradient.
Vec plus(const Tensor& initial, const Vec& grad) {
  Vec e = initial.values();
  for (size_t i = 0; i < e.size(); ++i) e[i] += grad[i];
  return e;
}

// |actual - expected| within the finite-difference tolerance, the max error printed.
void expect_grad(const Tensor& actual, const Vec& expected, const std::string& what) {
  report_error(actual.values(), expected, what);
  expect_close(actual.values(), expected, Tolerance{1e-3, 1e-4}, what);
}

double silu(double u) { return u / (1.0 + std::exp(-u)); }

// ---- causal_conv1d --------------------------------------------------------------------------

struct ConvCase {
  int64_t b, t, c, w;
  bool bias, init;
  int32_t act;
  std::string name() const {
    return "B " + std::to_string(b) + " T " + std::to_string(t) + " Cc " + std::to_string(c) +
           " W " + std::to_string(w) + (bias ? " bias" : "") + (init ? " init" : "") +
           (act ? " silu" : "");
  }
};

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> c = {
      {2, 7, 3, 4, true, true, 1},  {1, 1, 5, 4, false, true, 0}, {2, 2, 3, 4, true, false, 1},
      {1, 37, 4, 2, true, true, 1}, {2, 7, 3, 1, true, false, 0}, {1, 7, 2, 8, false, false, 1},
  };
  return c;
}

struct ConvIn {
  Vec x, w, bias, init;  // (B, T, Cc), (Cc, W), (Cc) or empty, (B, W - 1, Cc) or empty
};

// The header's formula, in f64: y (B, T, Cc) and the final state (B, W - 1, Cc).
void conv_oracle(const ConvCase& k, const ConvIn& in, Vec* y, Vec* fin) {
  auto xe = [&](int64_t b, int64_t s, int64_t c) -> double {
    if (s >= 0) return in.x[(b * k.t + s) * k.c + c];
    return in.init.empty() ? 0.0 : in.init[(b * (k.w - 1) + k.w - 1 + s) * k.c + c];
  };
  y->assign(static_cast<size_t>(k.b * k.t * k.c), 0.0);
  fin->assign(static_cast<size_t>(k.b * (k.w - 1) * k.c), 0.0);
  for (int64_t b = 0; b < k.b; ++b)
    for (int64_t c = 0; c < k.c; ++c) {
      for (int64_t t = 0; t < k.t; ++t) {
        double u = in.bias.empty() ? 0.0 : in.bias[c];
        for (int64_t j = 0; j < k.w; ++j) u += in.w[c * k.w + j] * xe(b, t + j - (k.w - 1), c);
        (*y)[(b * k.t + t) * k.c + c] = k.act ? silu(u) : u;
      }
      // the last W - 1 rows of [initial_state (or zeros), x]
      for (int64_t r = 0; r < k.w - 1; ++r)
        (*fin)[(b * (k.w - 1) + r) * k.c + c] = xe(b, k.t - (k.w - 1) + r, c);
    }
}

struct ConvTensors {
  Tensor x, w, bias, init;
  ConvTensors(const ConvCase& k, DType dt, std::mt19937& rng)
      : x(Tensor::random(dt, {k.b, k.t, k.c}, rng)),
        w(Tensor::random(dt, {k.c, k.w}, rng)),
        bias(maybe(k.bias, dt, {k.c}, rng)),
        init(maybe(k.init, dt, {k.b, k.w - 1, k.c}, rng)) {}
  ConvIn values() const { return {vals(x), vals(w), vals(bias), vals(init)}; }
};

class MambaForward : public ::testing::TestWithParam<DType> {};

TEST_P(MambaForward, CausalConv1dRefMatchesTheFormula) {
  const DType dt = GetParam();
  std::mt19937 rng(11);
  MaxError worst;
  for (const ConvCase& k : conv_cases()) {
    ConvTensors in(k, dt, rng);
    Tensor y(dt, {k.b, k.t, k.c}), fin(dt, {k.b, k.w - 1, k.c});
    ops::CausalConv1dAttrs at{k.act};
    run_ref(ops::kCausalConv1d, dt, {&in.x, &in.w, &in.bias, &in.init}, {&y, &fin}, &at);
    Vec ey, efin;
    conv_oracle(k, in.values(), &ey, &efin);
    const std::string what = std::string("causal_conv1d ") + dtype_name(dt) + " " + k.name();
    expect_close(y, ey, dt, what + " y");
    expect_close(fin, efin, dt, what + " final_state");
    const MaxError e = report_error(y.values(), ey, what + " y");
    worst.abs = std::max(worst.abs, e.abs);
  }
  std::printf("[error] causal_conv1d %s: worst y abs error %.3g\n", dtype_name(dt), worst.abs);
}

// ---- ssd_scan ---------------------------------------------------------------------------------

struct SsdCase {
  int64_t b, t, h, g, p, n;
  bool d, bias, init, softplus;
  int32_t chunk;
  int64_t hg() const { return h / g; }
  int64_t row() const { return hg() * p + 2 * n; }
  ops::SsdScanAttrs attrs() const {
    return {static_cast<int32_t>(p), static_cast<int32_t>(n), static_cast<int32_t>(g), chunk,
            softplus ? 1 : 0};
  }
  std::string name() const {
    return "B " + std::to_string(b) + " T " + std::to_string(t) + " H " + std::to_string(h) +
           " G " + std::to_string(g) + " P " + std::to_string(p) + " N " + std::to_string(n) +
           " chunk " + std::to_string(chunk) + (d ? " D" : "") + (bias ? " dt_bias" : "") +
           (init ? " init" : "") + (softplus ? " softplus" : "");
  }
};

// HG = 2, P = 3, N = 5, G = 1 and 2, T = 1, 7, 37, chunk sizes that do not divide T, every
// option on and off.
std::vector<SsdCase> ssd_cases() {
  std::vector<SsdCase> c;
  const bool opts[4][4] = {{true, true, true, true},
                           {false, false, false, true},
                           {true, false, true, false},
                           {false, true, false, false}};
  int i = 0;
  for (int64_t t : {1, 7, 37})
    for (int64_t g : {1, 2})
      for (int32_t chunk : {1, 4, 16, 64}) {
        const bool* o = opts[i++ % 4];
        c.push_back({g == 1 ? 2 : 1, t, 2 * g, g, 3, 5, o[0], o[1], o[2], o[3], chunk});
      }
  return c;
}

struct SsdIn {
  Vec xbc, dt, a_log, d, bias, init;
};

// The header's recurrence in f64: y (B, T, H, P), final state (B, H, P, N).
void ssd_oracle(const SsdCase& k, const SsdIn& in, Vec* y, Vec* fin) {
  const int64_t P = k.p, N = k.n, HG = k.hg(), L = k.row();
  y->assign(static_cast<size_t>(k.b * k.t * k.h * P), 0.0);
  fin->assign(static_cast<size_t>(k.b * k.h * P * N), 0.0);
  for (int64_t b = 0; b < k.b; ++b)
    for (int64_t h = 0; h < k.h; ++h) {
      const int64_t g = h / HG, hl = h % HG;
      Vec S(static_cast<size_t>(P * N), 0.0);
      if (!in.init.empty())
        for (int64_t i = 0; i < P * N; ++i) S[i] = in.init[(b * k.h + h) * P * N + i];
      const double A = -std::exp(in.a_log[h]);
      for (int64_t t = 0; t < k.t; ++t) {
        double dt = in.dt[(b * k.t + t) * k.h + h] + (in.bias.empty() ? 0.0 : in.bias[h]);
        if (k.softplus && dt <= 20.0) dt = std::log1p(std::exp(dt));
        const int64_t base = ((b * k.t + t) * k.g + g) * L;
        const double* x = &in.xbc[base + hl * P];
        const double* B = &in.xbc[base + HG * P];
        const double* C = &in.xbc[base + HG * P + N];
        for (int64_t p = 0; p < P; ++p)
          for (int64_t n = 0; n < N; ++n)
            S[p * N + n] = std::exp(dt * A) * S[p * N + n] + dt * x[p] * B[n];
        for (int64_t p = 0; p < P; ++p) {
          double acc = in.d.empty() ? 0.0 : in.d[h] * x[p];
          for (int64_t n = 0; n < N; ++n) acc += S[p * N + n] * C[n];
          (*y)[((b * k.t + t) * k.h + h) * P + p] = acc;
        }
      }
      for (int64_t i = 0; i < P * N; ++i) (*fin)[(b * k.h + h) * P * N + i] = S[i];
    }
}

struct SsdTensors {
  Tensor xbc, dt, a_log, d, bias, init;
  SsdTensors(const SsdCase& k, DType dtype, std::mt19937& rng)
      : xbc(Tensor::random(dtype, {k.b, k.t, k.g, k.row()}, rng)),
        dt(Tensor::random(dtype, {k.b, k.t, k.h}, rng, k.softplus ? -2.0 : 0.05,
                          k.softplus ? 1.0 : 0.8)),
        a_log(Tensor::random(dtype, {k.h}, rng, -1.5, 0.7)),
        d(maybe(k.d, dtype, {k.h}, rng)),
        bias(maybe(k.bias, dtype, {k.h}, rng, -0.5, 0.5)),
        init(maybe(k.init, DType::kF32, {k.b, k.h, k.p, k.n}, rng)) {}
  SsdIn values() const {
    return {vals(xbc), vals(dt), vals(a_log), vals(d), vals(bias), vals(init)};
  }
  std::vector<Tensor*> inputs() { return {&xbc, &dt, &a_log, &d, &bias, &init}; }
};

TEST_P(MambaForward, SsdScanRefMatchesTheRecurrence) {
  const DType dt = GetParam();
  std::mt19937 rng(12);
  double worst = 0;
  for (const SsdCase& k : ssd_cases()) {
    SsdTensors in(k, dt, rng);
    Tensor y(dt, {k.b, k.t, k.h, k.p}), fin(DType::kF32, {k.b, k.h, k.p, k.n});
    const ops::SsdScanAttrs at = k.attrs();
    run_ref(ops::kSsdScan, dt, in.inputs(), {&y, &fin}, &at);
    Vec ey, efin;
    ssd_oracle(k, in.values(), &ey, &efin);
    const std::string what = std::string("ssd_scan ") + dtype_name(dt) + " " + k.name();
    expect_close(y, ey, dt, what + " y");
    expect_close(fin, efin, DType::kF32, what + " final_state");
    worst = std::max(worst, report_error(y.values(), ey, what + " y").abs);
  }
  std::printf("[error] ssd_scan %s: worst y abs error %.3g\n", dtype_name(dt), worst);
}

// ---- rmsnorm_gated ------------------------------------------------------------------------

struct NormCase {
  int64_t n, c, group;
  float eps;
  std::string name() const {
    return "N " + std::to_string(n) + " C " + std::to_string(c) + " group_size " +
           std::to_string(group);
  }
};
const std::vector<NormCase>& norm_cases() {
  static const std::vector<NormCase> c = {{5, 12, 4, 1e-5f},
                                          {3, 12, 12, 1e-6f},
                                          {4, 7, 7, 1e-5f},
                                          {2, 6, 1, 1e-3f},
                                          {1, 40, 20, 1e-5f}};
  return c;
}

// out (N, C) and rstd (N, C / group) in f64.
void norm_oracle(const NormCase& k, const Vec& y, const Vec& z, const Vec& w, Vec* out, Vec* rstd) {
  out->assign(static_cast<size_t>(k.n * k.c), 0.0);
  rstd->assign(static_cast<size_t>(k.n * (k.c / k.group)), 0.0);
  for (int64_t r = 0; r < k.n; ++r)
    for (int64_t q = 0; q < k.c / k.group; ++q) {
      Vec g(static_cast<size_t>(k.group));
      double ms = 0;
      for (int64_t i = 0; i < k.group; ++i) {
        const int64_t e = r * k.c + q * k.group + i;
        g[i] = y[e] * silu(z[e]);
        ms += g[i] * g[i];
      }
      const double rs = 1.0 / std::sqrt(ms / static_cast<double>(k.group) + k.eps);
      for (int64_t i = 0; i < k.group; ++i)
        (*out)[r * k.c + q * k.group + i] = g[i] * rs * w[q * k.group + i];
      (*rstd)[r * (k.c / k.group) + q] = rs;
    }
}

TEST_P(MambaForward, RmsNormGatedRefMatchesTheFormula) {
  const DType dt = GetParam();
  std::mt19937 rng(13);
  for (const NormCase& k : norm_cases()) {
    Tensor y = Tensor::random(dt, {k.n, k.c}, rng, -2, 2),
           z = Tensor::random(dt, {k.n, k.c}, rng, -3, 3),
           w = Tensor::random(dt, {k.c}, rng, 0.5, 1.5);
    Tensor out(dt, {k.n, k.c}), rstd(DType::kF32, {k.n, k.c / k.group});
    const ops::RmsNormGatedAttrs at{k.eps, static_cast<int32_t>(k.group)};
    run_ref(ops::kRmsNormGated, dt, {&y, &z, &w}, {&out, &rstd}, &at);
    Vec eo, er;
    norm_oracle(k, y.values(), z.values(), w.values(), &eo, &er);
    const std::string what = std::string("rmsnorm_gated ") + dtype_name(dt) + " " + k.name();
    expect_close(out, eo, dt, what + " out");
    expect_close(rstd, er, DType::kF32, what + " rstd");
    report_error(out.values(), eo, what + " out");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MambaForward, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// ---- gradients against finite differences (f32) -------------------------------------------

const char* const kNames[] = {"cpu.ref", "cpu.fast"};
bool skip(const char* name) {
  return std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2");
}

TEST(MambaBackward, CausalConv1dMatchesFiniteDifferences) {
  const DType dt = DType::kF32;
  std::mt19937 rng(21);
  for (const ConvCase& k : conv_cases()) {
    if (k.t > 8) continue;  // small shapes
    for (const char* name : kNames) {
      if (skip(name)) continue;
      ConvTensors in(k, dt, rng);
      Tensor dy = Tensor::random(dt, {k.b, k.t, k.c}, rng);
      Tensor dx(dt, {k.b, k.t, k.c}), dw0 = Tensor::random(DType::kF32, {k.c, k.w}, rng),
                                      db0 = maybe(k.bias, DType::kF32, {k.c}, rng);
      Tensor dw = dw0, db = db0;
      const ops::CausalConv1dAttrs at{k.act};
      run(ops::kCausalConv1dBwd, name, dt, {&dy, &in.x, &in.w, &in.bias, &in.init}, {&dx, &dw, &db},
          &at);
      ConvIn v = in.values();
      const Vec w = dy.values();
      auto f = [&] {
        Vec y, fin;
        conv_oracle(k, v, &y, &fin);
        return y;
      };
      const std::string what = std::string("causal_conv1d_bwd ") + name + " " + k.name();
      expect_grad(dx, fd_grad(v.x, w, f), what + " dx");
      expect_grad(dw, plus(dw0, fd_grad(v.w, w, f)), what + " dweight");
      if (k.bias) expect_grad(db, plus(db0, fd_grad(v.bias, w, f)), what + " dbias");
    }
  }
}

TEST(MambaBackward, SsdScanMatchesFiniteDifferences) {
  const DType dt = DType::kF32;
  std::mt19937 rng(22);
  const std::vector<SsdCase> cases = {
      {1, 9, 4, 2, 3, 5, true, true, true, true, 4},
      {2, 7, 2, 1, 3, 5, true, false, false, false, 3},
      {1, 5, 2, 1, 2, 3, false, true, true, true, 16},
      {1, 1, 2, 2, 3, 5, true, true, true, true, 1},
  };
  for (const SsdCase& k : cases)
    for (const char* name : kNames) {
      if (skip(name)) continue;
      SsdTensors in(k, dt, rng);
      Tensor dy = Tensor::random(dt, {k.b, k.t, k.h, k.p}, rng);
      Tensor dxbc(dt, {k.b, k.t, k.g, k.row()}), ddt(dt, {k.b, k.t, k.h});
      Tensor da0 = Tensor::random(DType::kF32, {k.h}, rng),
             dd0 = maybe(k.d, DType::kF32, {k.h}, rng),
             db0 = maybe(k.bias, DType::kF32, {k.h}, rng);
      Tensor da = da0, dd = dd0, db = db0;
      const ops::SsdScanAttrs at = k.attrs();
      run(ops::kSsdScanBwd, name, dt, {&dy, &in.xbc, &in.dt, &in.a_log, &in.d, &in.bias, &in.init},
          {&dxbc, &ddt, &da, &dd, &db}, &at);
      SsdIn v = in.values();
      const Vec w = dy.values();
      auto f = [&] {
        Vec y, fin;
        ssd_oracle(k, v, &y, &fin);
        return y;
      };
      const std::string what = std::string("ssd_scan_bwd ") + name + " " + k.name();
      expect_grad(dxbc, fd_grad(v.xbc, w, f), what + " dxBC");
      expect_grad(ddt, fd_grad(v.dt, w, f), what + " ddt_in");
      expect_grad(da, plus(da0, fd_grad(v.a_log, w, f)), what + " dA_log");
      if (k.d) expect_grad(dd, plus(dd0, fd_grad(v.d, w, f)), what + " dD");
      if (k.bias) expect_grad(db, plus(db0, fd_grad(v.bias, w, f)), what + " ddt_bias");
    }
}

TEST(MambaBackward, RmsNormGatedMatchesFiniteDifferences) {
  const DType dt = DType::kF32;
  std::mt19937 rng(23);
  for (const NormCase& k : norm_cases())
    for (const char* name : kNames) {
      if (skip(name)) continue;
      Tensor y = Tensor::random(dt, {k.n, k.c}, rng, -2, 2),
             z = Tensor::random(dt, {k.n, k.c}, rng, -3, 3),
             w = Tensor::random(dt, {k.c}, rng, 0.5, 1.5),
             dout = Tensor::random(dt, {k.n, k.c}, rng);
      Tensor out(dt, {k.n, k.c}), rstd(DType::kF32, {k.n, k.c / k.group});
      const ops::RmsNormGatedAttrs at{k.eps, static_cast<int32_t>(k.group)};
      run(ops::kRmsNormGated, name, dt, {&y, &z, &w}, {&out, &rstd}, &at);
      Tensor dy(dt, {k.n, k.c}), dz(dt, {k.n, k.c}), dw0 = Tensor::random(DType::kF32, {k.c}, rng);
      Tensor dw = dw0;
      run(ops::kRmsNormGatedBwd, name, dt, {&dout, &y, &z, &w, &rstd}, {&dy, &dz, &dw}, &at);
      Vec vy = y.values(), vz = z.values(), vw = w.values();
      auto f = [&] {
        Vec o, r;
        norm_oracle(k, vy, vz, vw, &o, &r);
        return o;
      };
      const Vec g = dout.values();
      const std::string what = std::string("rmsnorm_gated_bwd ") + name + " " + k.name();
      expect_grad(dy, fd_grad(vy, g, f), what + " dy");
      expect_grad(dz, fd_grad(vz, g, f), what + " dz");
      expect_grad(dw, plus(dw0, fd_grad(vw, g, f)), what + " dweight");
    }
}

// ---- cpu.fast against cpu.ref --------------------------------------------------------------

class MambaFast : public ::testing::TestWithParam<DType> {};

TEST_P(MambaFast, CausalConv1dMatchesRef) {
  const DType dt = GetParam();
  std::mt19937 rng(31);
  for (const ConvCase& k : conv_cases()) {
    ConvTensors in(k, dt, rng);
    const ops::CausalConv1dAttrs at{k.act};
    expect_fast_matches_ref(ops::kCausalConv1d, dt, {in.x, in.w, in.bias, in.init},
                            {Tensor(dt, {k.b, k.t, k.c}), Tensor(dt, {k.b, k.w - 1, k.c})}, &at,
                            k.name());
    Tensor dy = Tensor::random(dt, {k.b, k.t, k.c}, rng);
    expect_fast_matches_ref(
        ops::kCausalConv1dBwd, dt, {dy, in.x, in.w, in.bias, in.init},
        {Tensor(dt, {k.b, k.t, k.c}), Tensor::random(DType::kF32, {k.c, k.w}, rng),
         maybe(k.bias, DType::kF32, {k.c}, rng)},
        &at, k.name());
  }
}

TEST_P(MambaFast, SsdScanChunkedMatchesRef) {
  const DType dt = GetParam();
  std::mt19937 rng(32);
  MaxError worst_y, worst_dx;
  for (const SsdCase& k : ssd_cases()) {
    SsdTensors in(k, dt, rng);
    const ops::SsdScanAttrs at = k.attrs();
    if (!skip("cpu.fast")) {  // the chunked form's distance from the recurrence, printed
      Tensor y[2] = {Tensor(dt, {k.b, k.t, k.h, k.p}), Tensor(dt, {k.b, k.t, k.h, k.p})};
      Tensor dy = Tensor::random(dt, {k.b, k.t, k.h, k.p}, rng), dx[2], ddt[2], da[2], dd[2], db[2];
      for (int i = 0; i < 2; ++i) {
        Tensor none;
        run(ops::kSsdScan, kNames[i], dt, in.inputs(), {&y[i], &none}, &at);
        dx[i] = Tensor(dt, {k.b, k.t, k.g, k.row()});
        ddt[i] = Tensor(dt, {k.b, k.t, k.h});
        da[i] = Tensor(DType::kF32, {k.h});
        dd[i] = maybe(k.d, DType::kF32, {k.h}, rng, 0, 0);
        db[i] = maybe(k.bias, DType::kF32, {k.h}, rng, 0, 0);
        run(ops::kSsdScanBwd, kNames[i], dt,
            {&dy, &in.xbc, &in.dt, &in.a_log, &in.d, &in.bias, &in.init},
            {&dx[i], &ddt[i], &da[i], &dd[i], &db[i]}, &at);
      }
      const MaxError ey = report_error(y[1].values(), y[0].values(), "fast vs ref y " + k.name());
      const MaxError ed =
          report_error(dx[1].values(), dx[0].values(), "fast vs ref dxBC " + k.name());
      worst_y.abs = std::max(worst_y.abs, ey.abs);
      worst_dx.abs = std::max(worst_dx.abs, ed.abs);
    }
    expect_fast_matches_ref(
        ops::kSsdScan, dt, {in.xbc, in.dt, in.a_log, in.d, in.bias, in.init},
        {Tensor(dt, {k.b, k.t, k.h, k.p}), Tensor(DType::kF32, {k.b, k.h, k.p, k.n})}, &at,
        k.name());
    Tensor dy = Tensor::random(dt, {k.b, k.t, k.h, k.p}, rng);
    expect_fast_matches_ref(
        ops::kSsdScanBwd, dt, {dy, in.xbc, in.dt, in.a_log, in.d, in.bias, in.init},
        {Tensor(dt, {k.b, k.t, k.g, k.row()}), Tensor(dt, {k.b, k.t, k.h}),
         Tensor::random(DType::kF32, {k.h}, rng), maybe(k.d, DType::kF32, {k.h}, rng),
         maybe(k.bias, DType::kF32, {k.h}, rng)},
        &at, k.name());
  }
  std::printf("[error] ssd_scan %s chunked vs recurrence: worst y abs %.3g, worst dxBC abs %.3g\n",
              dtype_name(dt), worst_y.abs, worst_dx.abs);
}

TEST_P(MambaFast, RmsNormGatedMatchesRef) {
  const DType dt = GetParam();
  std::mt19937 rng(33);
  for (const NormCase& k : norm_cases()) {
    Tensor y = Tensor::random(dt, {k.n, k.c}, rng, -2, 2),
           z = Tensor::random(dt, {k.n, k.c}, rng, -3, 3),
           w = Tensor::random(dt, {k.c}, rng, 0.5, 1.5), dout = Tensor::random(dt, {k.n, k.c}, rng);
    Tensor out(dt, {k.n, k.c}), rstd(DType::kF32, {k.n, k.c / k.group});
    const ops::RmsNormGatedAttrs at{k.eps, static_cast<int32_t>(k.group)};
    expect_fast_matches_ref(ops::kRmsNormGated, dt, {y, z, w},
                            {Tensor(dt, {k.n, k.c}), Tensor(DType::kF32, {k.n, k.c / k.group})},
                            &at, k.name());
    run_ref(ops::kRmsNormGated, dt, {&y, &z, &w}, {&out, &rstd}, &at);
    expect_fast_matches_ref(
        ops::kRmsNormGatedBwd, dt, {dout, y, z, w, rstd},
        {Tensor(dt, {k.n, k.c}), Tensor(dt, {k.n, k.c}), Tensor::random(DType::kF32, {k.c}, rng)},
        &at, k.name());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MambaFast, ::testing::ValuesIn(float_dtypes()), dtype_param_name);

// ---- decoding: one call equals calls over pieces, state passed along ----------------------

// Rows [t0, t1) of a (B, T, ...) tensor of `inner` elements per (b, t), as a new tensor.
Tensor rows(const Tensor& x, int64_t t0, int64_t t1) {
  std::vector<int64_t> shape = x.shape();
  const int64_t b = shape[0], t = shape[1], inner = x.numel() / (b * t);
  shape[1] = t1 - t0;
  Tensor out(x.dtype(), shape);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = t0; j < t1; ++j)
      for (int64_t e = 0; e < inner; ++e)
        out.set((i * (t1 - t0) + j - t0) * inner + e, x.get((i * t + j) * inner + e));
  return out;
}

// Writes `piece` (rows [t0, ...)) into x.
void put_rows(Tensor& x, const Tensor& piece, int64_t t0) {
  const int64_t b = x.shape()[0], t = x.shape()[1], inner = x.numel() / (b * t);
  const int64_t tp = piece.shape()[1];
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < tp; ++j)
      for (int64_t e = 0; e < inner; ++e)
        x.set((i * t + t0 + j) * inner + e, piece.get((i * tp + j) * inner + e));
}

TEST(MambaDecoding, CausalConv1dInPiecesEqualsOneCall) {
  const DType dt = DType::kF32;
  std::mt19937 rng(41);
  // T = 7 as 2 + 1 + 1 + 3 (pieces shorter than W - 1 = 3) and 7 single steps.
  const std::vector<std::vector<int64_t>> splits = {{0, 2, 3, 4, 7}, {0, 1, 2, 3, 4, 5, 6, 7}};
  for (const char* name : kNames)
    for (bool init : {false, true})
      for (const auto& cuts : splits) {
        if (skip(name)) continue;
        const ConvCase k{2, 7, 3, 4, true, init, 1};
        ConvTensors in(k, dt, rng);
        const ops::CausalConv1dAttrs at{1};
        Tensor y(dt, {k.b, k.t, k.c}), fin(dt, {k.b, k.w - 1, k.c});
        run(ops::kCausalConv1d, name, dt, {&in.x, &in.w, &in.bias, &in.init}, {&y, &fin}, &at);
        Tensor yp(dt, {k.b, k.t, k.c}), state = in.init;
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
          Tensor xi = rows(in.x, cuts[i], cuts[i + 1]);
          Tensor yi(dt, {k.b, cuts[i + 1] - cuts[i], k.c}), next(dt, {k.b, k.w - 1, k.c});
          run(ops::kCausalConv1d, name, dt, {&xi, &in.w, &in.bias, &state}, {&yi, &next}, &at);
          put_rows(yp, yi, cuts[i]);
          state = next;
        }
        const std::string what = std::string("causal_conv1d ") + name + " in " +
                                 std::to_string(cuts.size() - 1) + " pieces" +
                                 (init ? " init" : "");
        expect_close(yp, y.values(), dt, what + " y");
        expect_close(state, fin.values(), dt, what + " final_state");
      }
}

TEST(MambaDecoding, SsdScanInPiecesEqualsOneCall) {
  const DType dt = DType::kF32;
  std::mt19937 rng(42);
  const std::vector<std::vector<int64_t>> splits = {{0, 20, 37}, {0, 1, 2, 3, 17, 18, 37}};
  for (const char* name : kNames)
    for (const auto& cuts : splits) {
      if (skip(name)) continue;
      const SsdCase k{2, 37, 4, 2, 3, 5, true, true, true, true, 16};
      SsdTensors in(k, dt, rng);
      const ops::SsdScanAttrs at = k.attrs();
      Tensor y(dt, {k.b, k.t, k.h, k.p}), fin(DType::kF32, {k.b, k.h, k.p, k.n});
      run(ops::kSsdScan, name, dt, in.inputs(), {&y, &fin}, &at);
      Tensor yp(dt, {k.b, k.t, k.h, k.p}), state = in.init;
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        Tensor xi = rows(in.xbc, cuts[i], cuts[i + 1]), di = rows(in.dt, cuts[i], cuts[i + 1]);
        Tensor yi(dt, {k.b, cuts[i + 1] - cuts[i], k.h, k.p});
        // final_state aliases initial_state: the decoding call updates its state in place
        CallHolder h({&xi, &di, &in.a_log, &in.d, &in.bias, &state}, {&yi, &state}, &at);
        Status st = kernel(ops::kSsdScan, dt, name).fn(&h.call);
        ASSERT_EQ(st.code, Code::kOk) << take_message(&st);
        put_rows(yp, yi, cuts[i]);
      }
      const std::string what =
          std::string("ssd_scan ") + name + " in " + std::to_string(cuts.size() - 1) + " pieces";
      expect_close(yp, y.values(), dt, what + " y");
      expect_close(state, fin.values(), dt, what + " final_state");
      report_error(yp.values(), y.values(), what + " y");
    }
}

// ---- bad calls ---------------------------------------------------------------------------

// The message of a refused call (the kernel run directly; its `supports` must decline too).
template <class A>
std::string refusal(const char* op, DType key, const std::vector<Tensor*>& in,
                    const std::vector<Tensor*>& out, const A* attrs) {
  const KernelDesc& k = kernel(op, key, "cpu.ref");
  CallHolder h(in, out, attrs);
  EXPECT_FALSE(k.supports(&h.call)) << op;
  Status s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << op;
  return s.code == Code::kOk ? std::string() : take_message(&s);
}

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(MambaErrors, CausalConv1dBadCallsAreRefused) {
  const DType f = DType::kF32;
  Tensor x(f, {2, 5, 6}), w(f, {6, 4}), bias(f, {6}), init(f, {2, 3, 6}), y(f, {2, 5, 6}),
      fin(f, {2, 3, 6}), none;
  const ops::CausalConv1dAttrs at{1};
  Tensor w9(f, {6, 9}), w5(f, {5, 4}), bias16(DType::kBF16, {6}), init_bad(f, {2, 2, 6});
  EXPECT_THAT(refusal(ops::kCausalConv1d, f, {&x, &w9, &bias, &init}, {&y, &fin}, &at),
              AllOf(StartsWith("causal_conv1d: "), HasSubstr("W = 9 must be in [1, 8]")));
  EXPECT_THAT(refusal(ops::kCausalConv1d, f, {&x, &w5, &bias, &init}, {&y, &fin}, &at),
              AllOf(StartsWith("causal_conv1d: "), HasSubstr("input 1 (weight)")));
  EXPECT_THAT(refusal(ops::kCausalConv1d, f, {&x, &w, &bias16, &init}, {&y, &fin}, &at),
              AllOf(StartsWith("causal_conv1d: "), HasSubstr("input 2 (bias) has dtype bf16")));
  EXPECT_THAT(refusal(ops::kCausalConv1d, f, {&x, &w, &bias, &init_bad}, {&y, &fin}, &at),
              HasSubstr("input 3 (initial_state) has shape (2, 2, 6), expected (B, W - 1, Cc)"));
  const ops::CausalConv1dAttrs bad_act{2};
  EXPECT_THAT(refusal(ops::kCausalConv1d, f, {&x, &w, &bias, &init}, {&y, &fin}, &bad_act),
              HasSubstr("causal_conv1d: activation = 2"));
  {  // the final state over the initial state
    const KernelDesc& k = kernel(ops::kCausalConv1d, f, "cpu.ref");
    CallHolder h({&x, &w, &bias, &init}, {&y, &init}, &at);
    Status s = k.fn(&h.call);
    EXPECT_THAT(take_message(&s), HasSubstr("must not alias an input"));
  }
  Tensor dx(f, {2, 5, 6}), dw(f, {6, 4}), db(f, {6});
  EXPECT_THAT(
      refusal(ops::kCausalConv1dBwd, f, {&y, &x, &w, &none, &init}, {&dx, &dw, &db}, &at),
      AllOf(StartsWith("causal_conv1d_bwd: "), HasSubstr("output 2 (dbias) must be empty")));
  Tensor dw16(DType::kBF16, {6, 4});
  EXPECT_THAT(refusal(ops::kCausalConv1dBwd, f, {&y, &x, &w, &bias, &init}, {&dx, &dw16, &db}, &at),
              HasSubstr("causal_conv1d_bwd: output 1 (dweight) has dtype bf16, expected f32"));
}

TEST(MambaErrors, SsdScanBadCallsAreRefused) {
  const DType f = DType::kF32;
  // B 1, T 3, H 4, G 2, P 3, N 5: xBC (1, 3, 2, 16)
  Tensor xbc(f, {1, 3, 2, 16}), dt(f, {1, 3, 4}), a(f, {4}), d(f, {4}), bias(f, {4}),
      init(DType::kF32, {1, 4, 3, 5}), y(f, {1, 3, 4, 3}), fin(DType::kF32, {1, 4, 3, 5}), none;
  const ops::SsdScanAttrs at{3, 5, 2, 0, 1};
  const ops::SsdScanAttrs g3{3, 5, 3, 0, 1};
  EXPECT_THAT(
      refusal(ops::kSsdScan, f, {&xbc, &dt, &a, &d, &bias, &init}, {&y, &fin}, &g3),
      AllOf(StartsWith("ssd_scan: "), HasSubstr("num_groups = 3 must divide the heads H = 4")));
  Tensor xbc_bad(f, {1, 3, 2, 15});
  EXPECT_THAT(refusal(ops::kSsdScan, f, {&xbc_bad, &dt, &a, &d, &bias, &init}, {&y, &fin}, &at),
              HasSubstr("ssd_scan: input 0 (xBC) has shape (1, 3, 2, 15), expected (B, T, G, HG * "
                        "P + 2N) = (1, 3, 2, 16)"));
  Tensor dt16(DType::kF16, {1, 3, 4});
  EXPECT_THAT(refusal(ops::kSsdScan, f, {&xbc, &dt16, &a, &d, &bias, &init}, {&y, &fin}, &at),
              HasSubstr("ssd_scan: input 1 (dt_in) has dtype f16, expected xBC's dtype f32"));
  Tensor init16(DType::kBF16, {1, 4, 3, 5});
  EXPECT_THAT(refusal(ops::kSsdScan, f, {&xbc, &dt, &a, &d, &bias, &init16}, {&y, &fin}, &at),
              HasSubstr("ssd_scan: input 5 (initial_state) has dtype bf16, expected f32"));
  Tensor d_bad(f, {3});
  EXPECT_THAT(refusal(ops::kSsdScan, f, {&xbc, &dt, &a, &d_bad, &bias, &init}, {&y, &fin}, &at),
              HasSubstr("ssd_scan: input 3 (D) has shape (3), expected (H) = (4)"));
  const ops::SsdScanAttrs p0{0, 5, 2, 0, 1};
  EXPECT_THAT(refusal(ops::kSsdScan, f, {&xbc, &dt, &a, &d, &bias, &init}, {&y, &fin}, &p0),
              HasSubstr("ssd_scan: head_dim = 0 must be >= 1"));
  Tensor dxbc(f, {1, 3, 2, 16}), ddt(f, {1, 3, 4}), da(f, {4}), dd(f, {4}), db(f, {4});
  EXPECT_THAT(refusal(ops::kSsdScanBwd, f, {&y, &xbc, &dt, &a, &d, &bias, &init},
                      {&dxbc, &ddt, &da, &none, &db}, &at),
              HasSubstr("ssd_scan_bwd: output 3 (dD) must be given when input 4 (D) is given"));
  Tensor y_bad(f, {1, 3, 4, 2});
  EXPECT_THAT(refusal(ops::kSsdScanBwd, f, {&y_bad, &xbc, &dt, &a, &d, &bias, &init},
                      {&dxbc, &ddt, &da, &dd, &db}, &at),
              HasSubstr("ssd_scan_bwd: input 0 (dy) has shape (1, 3, 4, 2)"));
}

TEST(MambaErrors, RmsNormGatedBadCallsAreRefused) {
  const DType f = DType::kF32;
  Tensor y(f, {3, 8}), z(f, {3, 8}), w(f, {8}), out(f, {3, 8}), rstd(f, {3, 2});
  const ops::RmsNormGatedAttrs at{1e-5f, 4};
  const ops::RmsNormGatedAttrs g5{1e-5f, 5};
  EXPECT_THAT(refusal(ops::kRmsNormGated, f, {&y, &z, &w}, {&out, &rstd}, &g5),
              HasSubstr("rmsnorm_gated: group_size = 5 must be >= 1 and divide C = 8"));
  Tensor z16(DType::kBF16, {3, 8});
  EXPECT_THAT(refusal(ops::kRmsNormGated, f, {&y, &z16, &w}, {&out, &rstd}, &at),
              HasSubstr("rmsnorm_gated: input 1 (z) has dtype bf16, expected y's dtype f32"));
  Tensor rstd_bad(f, {3, 3});
  EXPECT_THAT(refusal(ops::kRmsNormGated, f, {&y, &z, &w}, {&out, &rstd_bad}, &at),
              HasSubstr("rmsnorm_gated: output 1 (rstd)"));
  Tensor dy(f, {3, 8}), dz(f, {3, 8}), dw(f, {8}), w_bad(f, {7});
  EXPECT_THAT(
      refusal(ops::kRmsNormGatedBwd, f, {&out, &y, &z, &w_bad, &rstd}, {&dy, &dz, &dw}, &at),
      HasSubstr("rmsnorm_gated_bwd: input 3 (weight) has shape (7), expected (C) = (8)"));
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
