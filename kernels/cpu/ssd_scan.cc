// ssd_scan / ssd_scan_bwd: the selective state-space scan of Mamba-2 (loom/ops/mamba.h). Per
// batch row b and head h (group g = h / HG), with a_t = dt_t * A and S (P, N):
//   S_t = exp(a_t) S_{t-1} + dt_t x_t B_t^T,   y_t = S_t C_t + D x_t
//
// reference: the recurrence one step at a time, S in f32, sums in f64. Its gradient runs the
// recurrence backwards over the stored states:
//   dS_t = dy_t C_t^T + exp(a_{t+1}) dS_{t+1}
//   dC_t = S_t^T dy_t,  dx_t = D dy_t + dt_t dS_t B_t,  dB_t = dt_t dS_t^T x_t,
//   ddt_t = x_t^T dS_t B_t + A da_t,  da_t = exp(a_t) <dS_t, S_{t-1}>,  dA += dt_t da_t
//   dA_log += A dA (A = -exp(A_log)),  dD += dy_t . x_t,  ddt_in = ddt * softplus'
//
// fast: the chunked SSD form, OpenMP over (b, h). Within a chunk of Q steps, with cs_i the
// cumulative sum of a over the chunk up to step i and S_0 the state entering it:
//   y_i = exp(cs_i) S_0 C_i + sum_{j <= i} exp(cs_i - cs_j) dt_j (C_i . B_j) x_j + D x_i
//   S_end = exp(cs_last) S_0 + sum_j exp(cs_last - cs_j) dt_j x_j B_j^T
// and its gradient differentiates exactly these two lines per chunk, last chunk first, with
// the chunk-entry states of a forward pass and dS carried between chunks; the gradients of
// the cs_i turn into those of the a_k by a reverse cumulative sum.
#include <loom/cpp/op_checks/mamba.h>
#include <loom/cpp/tensor.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::SsdScanShape;

SsdScanShape check_scan(const OpCall* call, bool shapes_only) {
  return op_checks::check_ssd_scan(call, shapes_only, DeviceType::kCpu);
}
SsdScanShape check_scan_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_ssd_scan_bwd(call, shapes_only, DeviceType::kCpu);
}

// dt from dt_in + dt_bias: softplus (log1p(exp(v)), v itself above 20) or the identity.
double dt_of(double v, bool softplus) {
  return !softplus || v > 20.0 ? v : std::log1p(std::exp(v));
}
// d dt / d v.
double dt_grad(double v, bool softplus) {
  return !softplus || v > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-v));
}

// Element offsets into the packed xBC (B, T, G, HG * P + 2N) of one (b, h).
struct XbcIndex {
  const SsdScanShape& s;
  int64_t b, h, g, hl, row;  // row: HG * P + 2N

  XbcIndex(const SsdScanShape& shape, int64_t b_, int64_t h_)
      : s(shape), b(b_), h(h_), g(h_ / (shape.h / shape.g)), hl(h_ % (shape.h / shape.g)) {
    row = (s.h / s.g) * s.p + 2 * s.n;
  }
  int64_t base(int64_t t) const { return ((b * s.t + t) * s.g + g) * row; }
  int64_t x(int64_t t) const { return base(t) + hl * s.p; }
  int64_t B(int64_t t) const { return base(t) + (s.h / s.g) * s.p; }
  int64_t C(int64_t t) const { return B(t) + s.n; }
};

// The per-head scalars of one (b, h) call: A, D (0 without), dt_bias (0 without).
struct HeadParams {
  double A, D, bias;
};
HeadParams head_params(const OpCall* call, int a_log, int64_t h) {
  const TensorView &Al = call->inputs[a_log], &Dv = call->inputs[a_log + 1],
                   &bias = call->inputs[a_log + 2];
  return {-std::exp(static_cast<double>(load(Al, h))), present(Dv) ? load(Dv, h) : 0.0,
          present(bias) ? load(bias, h) : 0.0};
}

// ---- reference ----------------------------------------------------------------------------

// Runs the recurrence of one (b, h) from `S` (P * N, in: the initial state, out: the final
// one), writing y when `y` is given and every state S_t (t = 0 .. T-1) into `states` when
// given ((T, P, N)).
void scan_head_ref(const OpCall* call, int xi, const SsdScanShape& s, int64_t b, int64_t h,
                   std::vector<float>& S, const TensorView* y, std::vector<float>* states) {
  const TensorView &xbc = call->inputs[xi], &dt_in = call->inputs[xi + 1];
  const HeadParams hp = head_params(call, xi + 2, h);
  const XbcIndex ix(s, b, h);
  const int64_t P = s.p, N = s.n;
  std::vector<double> x(static_cast<size_t>(P)), Bv(static_cast<size_t>(N));
  for (int64_t t = 0; t < s.t; ++t) {
    const double dt = dt_of(load(dt_in, (b * s.t + t) * s.h + h) + hp.bias, s.attrs.dt_softplus);
    const double decay = std::exp(dt * hp.A);
    for (int64_t p = 0; p < P; ++p) x[p] = load(xbc, ix.x(t) + p);
    for (int64_t n = 0; n < N; ++n) Bv[n] = load(xbc, ix.B(t) + n);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t n = 0; n < N; ++n)
        S[p * N + n] = static_cast<float>(decay * S[p * N + n] + dt * x[p] * Bv[n]);
    if (states != nullptr) std::copy(S.begin(), S.end(), states->begin() + t * P * N);
    if (y == nullptr) continue;
    for (int64_t p = 0; p < P; ++p) {
      double acc = hp.D * x[p];
      for (int64_t n = 0; n < N; ++n)
        acc += S[p * N + n] * static_cast<double>(load(xbc, ix.C(t) + n));
      store(*y, ((b * s.t + t) * s.h + h) * P + p, static_cast<float>(acc));
    }
  }
}

// The state entering the scan of (b, h): initial_state's (copied: the final state may alias
// it) or zeros.
std::vector<float> initial_state(const TensorView& init, const SsdScanShape& s, int64_t b,
                                 int64_t h) {
  std::vector<float> S(static_cast<size_t>(s.p * s.n), 0.0f);
  if (present(init)) {
    const float* src = f32(init) + (b * s.h + h) * s.p * s.n;
    std::copy(src, src + s.p * s.n, S.begin());
  }
  return S;
}

Status ssd_scan_ref(const OpCall* call) {
  return guard([&] {
    SsdScanShape s = check_scan(call, false);
    const TensorView& fin = call->outputs[1];
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        std::vector<float> S = initial_state(call->inputs[5], s, b, h);
        scan_head_ref(call, 0, s, b, h, S, &call->outputs[0], nullptr);
        if (present(fin)) std::copy(S.begin(), S.end(), f32_mut(fin) + (b * s.h + h) * s.p * s.n);
      }
  });
}

Status ssd_scan_bwd_ref(const OpCall* call) {
  return guard([&] {
    SsdScanShape s = check_scan_bwd(call, false);
    const TensorView &dy = call->inputs[0], &xbc = call->inputs[1], &dt_in = call->inputs[2];
    const TensorView &dxbc = call->outputs[0], &ddt_in = call->outputs[1];
    const int64_t P = s.p, N = s.n, PN = P * N;
    std::vector<double> dx_all(static_cast<size_t>(numel(xbc)), 0.0);  // dxBC, summed
    std::vector<double> dA_log(static_cast<size_t>(s.h), 0.0), dD(static_cast<size_t>(s.h), 0.0),
        dbias(static_cast<size_t>(s.h), 0.0);
    std::vector<float> states(static_cast<size_t>(s.t * PN));  // (T, P, N): S_t
    std::vector<double> dS(static_cast<size_t>(PN)), x(static_cast<size_t>(P)),
        Bv(static_cast<size_t>(N)), Cv(static_cast<size_t>(N)), g(static_cast<size_t>(P));
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        const HeadParams hp = head_params(call, 3, h);
        const XbcIndex ix(s, b, h);
        const std::vector<float> S0 = initial_state(call->inputs[6], s, b, h);
        std::vector<float> S = S0;
        scan_head_ref(call, 1, s, b, h, S, nullptr, &states);
        std::fill(dS.begin(), dS.end(), 0.0);
        double dA = 0.0;
        for (int64_t t = s.t - 1; t >= 0; --t) {
          const double v = load(dt_in, (b * s.t + t) * s.h + h) + hp.bias;
          const double dt = dt_of(v, s.attrs.dt_softplus), decay = std::exp(dt * hp.A);
          for (int64_t p = 0; p < P; ++p) x[p] = load(xbc, ix.x(t) + p);
          for (int64_t p = 0; p < P; ++p) g[p] = load(dy, ((b * s.t + t) * s.h + h) * P + p);
          for (int64_t n = 0; n < N; ++n) Bv[n] = load(xbc, ix.B(t) + n);
          for (int64_t n = 0; n < N; ++n) Cv[n] = load(xbc, ix.C(t) + n);
          const float* St = states.data() + t * PN;
          const float* Sprev = t > 0 ? states.data() + (t - 1) * PN : S0.data();
          double ddt = 0.0, da = 0.0;
          for (int64_t p = 0; p < P; ++p) {
            double dxp = hp.D * g[p];
            dD[h] += g[p] * x[p];
            for (int64_t n = 0; n < N; ++n) {
              double& d = dS[p * N + n];
              d += g[p] * Cv[n];  // now the gradient of S_t
              dx_all[ix.C(t) + n] += g[p] * St[p * N + n];
              dxp += dt * d * Bv[n];
              dx_all[ix.B(t) + n] += dt * d * x[p];
              ddt += d * x[p] * Bv[n];
              da += d * Sprev[p * N + n];
            }
            dx_all[ix.x(t) + p] += dxp;
          }
          da *= decay;
          ddt += hp.A * da;
          dA += dt * da;
          const double dv = ddt * dt_grad(v, s.attrs.dt_softplus);
          store(ddt_in, (b * s.t + t) * s.h + h, static_cast<float>(dv));
          dbias[h] += dv;
          for (double& d : dS) d *= decay;  // the gradient of S_{t-1}
        }
        dA_log[h] += hp.A * dA;
      }
    for (int64_t i = 0; i < numel(xbc); ++i) store(dxbc, i, static_cast<float>(dx_all[i]));
    for (int64_t h = 0; h < s.h; ++h) {
      f32_mut(call->outputs[2])[h] += static_cast<float>(dA_log[h]);
      if (present(call->outputs[3])) f32_mut(call->outputs[3])[h] += static_cast<float>(dD[h]);
      if (present(call->outputs[4])) f32_mut(call->outputs[4])[h] += static_cast<float>(dbias[h]);
    }
  });
}

// ---- fast: chunked ------------------------------------------------------------------------

LOOM_CPU_FAST_BEGIN

// One chunk [t0, t0 + len) of one (b, h) in f32: pointers to x, B, C of each step (into the
// f32 copy of xBC), dt, and cs (the cumulative sum of dt * A over the chunk, f64).
struct Chunk {
  int64_t t0 = 0, len = 0;
  std::vector<const float*> x, B, C;
  std::vector<double> v, dt, cs;

  explicit Chunk(int64_t q)
      : x(static_cast<size_t>(q)),
        B(static_cast<size_t>(q)),
        C(static_cast<size_t>(q)),
        v(static_cast<size_t>(q)),
        dt(static_cast<size_t>(q)),
        cs(static_cast<size_t>(q)) {}

  void load(const float* xbc, const float* dt_in, const SsdScanShape& s, const XbcIndex& ix,
            const HeadParams& hp, int64_t start) {
    t0 = start;
    len = std::min<int64_t>(s.attrs.chunk_size, s.t - start);
    double acc = 0.0;
    for (int64_t i = 0; i < len; ++i) {
      const int64_t t = t0 + i;
      x[i] = xbc + ix.x(t);
      B[i] = xbc + ix.B(t);
      C[i] = xbc + ix.C(t);
      v[i] = static_cast<double>(dt_in[(ix.b * s.t + t) * s.h + ix.h]) + hp.bias;
      dt[i] = dt_of(v[i], s.attrs.dt_softplus);
      cs[i] = acc += dt[i] * hp.A;
    }
  }
  // S = exp(cs_last) S + sum_j exp(cs_last - cs_j) dt_j x_j B_j^T.
  void advance(float* S, int64_t P, int64_t N) const {
    const double last = cs[len - 1];
    const float e = static_cast<float>(std::exp(last));
    for (int64_t k = 0; k < P * N; ++k) S[k] *= e;
    for (int64_t j = 0; j < len; ++j) {
      const float w = static_cast<float>(std::exp(last - cs[j]) * dt[j]);
      for (int64_t p = 0; p < P; ++p) {
        const float xp = w * x[j][p];
        float* Sp = S + p * N;
        for (int64_t n = 0; n < N; ++n) Sp[n] += xp * B[j][n];
      }
    }
  }
};

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

Status ssd_scan_fast(const OpCall* call) {
  return guard([&] {
    SsdScanShape s = check_scan(call, false);
    const F32Copy xbc(call->inputs[0]), dt_in(call->inputs[1]);
    const TensorView &y = call->outputs[0], &fin = call->outputs[1];
    const int64_t P = s.p, N = s.n, Q = s.attrs.chunk_size;
#pragma omp parallel
    {
      Chunk ch(std::min<int64_t>(Q, std::max<int64_t>(s.t, 1)));
      std::vector<float> yv(static_cast<size_t>(P));
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < s.b * s.h; ++bh) {
        const int64_t b = bh / s.h, h = bh % s.h;
        const HeadParams hp = head_params(call, 2, h);
        const XbcIndex ix(s, b, h);
        std::vector<float> S = initial_state(call->inputs[5], s, b, h);
        for (int64_t t0 = 0; t0 < s.t; t0 += Q) {
          ch.load(xbc.data(), dt_in.data(), s, ix, hp, t0);
          for (int64_t i = 0; i < ch.len; ++i) {
            // y_i = exp(cs_i) S_0 C_i + sum_{j<=i} exp(cs_i - cs_j) dt_j (C_i . B_j) x_j + D x_i
            const float e = static_cast<float>(std::exp(ch.cs[i]));
            for (int64_t p = 0; p < P; ++p)
              yv[p] = e * dot(S.data() + p * N, ch.C[i], N) + static_cast<float>(hp.D) * ch.x[i][p];
            for (int64_t j = 0; j <= i; ++j) {
              const float w = static_cast<float>(std::exp(ch.cs[i] - ch.cs[j]) * ch.dt[j]) *
                              dot(ch.C[i], ch.B[j], N);
              for (int64_t p = 0; p < P; ++p) yv[p] += w * ch.x[j][p];
            }
            store_row(y.data, y.dtype, ((b * s.t + t0 + i) * s.h + h) * P, P, yv.data());
          }
          ch.advance(S.data(), P, N);
        }
        if (present(fin)) std::copy(S.begin(), S.end(), f32_mut(fin) + bh * P * N);
      }
    }
  });
}

Status ssd_scan_bwd_fast(const OpCall* call) {
  return guard([&] {
    SsdScanShape s = check_scan_bwd(call, false);
    const F32Copy dy(call->inputs[0]), xbc(call->inputs[1]), dt_in(call->inputs[2]);
    const TensorView &dxbc = call->outputs[0], &ddt_in = call->outputs[1];
    const int64_t P = s.p, N = s.n, PN = P * N, Q = s.attrs.chunk_size, hg = s.h / s.g;
    const int64_t chunks = (s.t + Q - 1) / Q;
    // dB, dC of each head (B, H, T, 2N), summed over a group's heads afterwards.
    std::vector<float> dbc(static_cast<size_t>(s.b * s.h * s.t * 2 * N));
    // Per (b, h): dA_log, dD, ddt_bias, summed over b afterwards.
    std::vector<double> dparams(static_cast<size_t>(s.b * s.h * 3), 0.0);
#pragma omp parallel
    {
      const int64_t q = std::min<int64_t>(Q, std::max<int64_t>(s.t, 1));
      Chunk ch(q);
      std::vector<float> states;  // (chunks, P, N): the state entering each chunk
      std::vector<float> dS(static_cast<size_t>(PN)), dS_prev(static_cast<size_t>(PN));
      std::vector<float> dx(static_cast<size_t>(q * P)), ddt(static_cast<size_t>(q));
      std::vector<double> dcs(static_cast<size_t>(q));
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < s.b * s.h; ++bh) {
        const int64_t b = bh / s.h, h = bh % s.h;
        const HeadParams hp = head_params(call, 3, h);
        const XbcIndex ix(s, b, h);
        states.assign(static_cast<size_t>(chunks * PN), 0.0f);
        std::vector<float> S = initial_state(call->inputs[6], s, b, h);
        for (int64_t k = 0; k < chunks; ++k) {
          std::copy(S.begin(), S.end(), states.begin() + k * PN);
          ch.load(xbc.data(), dt_in.data(), s, ix, hp, k * Q);
          ch.advance(S.data(), P, N);
        }
        float* dB_h = dbc.data() + bh * s.t * 2 * N;  // (T, 2N): dB then dC per step
        std::fill(dB_h, dB_h + s.t * 2 * N, 0.0f);
        std::fill(dS.begin(), dS.end(), 0.0f);  // the gradient of the chunk's final state
        double dA = 0.0, dD = 0.0, dbias = 0.0;
        for (int64_t k = chunks - 1; k >= 0; --k) {
          ch.load(xbc.data(), dt_in.data(), s, ix, hp, k * Q);
          const float* S0 = states.data() + k * PN;
          const int64_t len = ch.len;
          std::fill(dx.begin(), dx.begin() + len * P, 0.0f);
          std::fill(ddt.begin(), ddt.begin() + len, 0.0f);
          std::fill(dcs.begin(), dcs.begin() + len, 0.0);
          auto g_of = [&](int64_t i) { return dy.data() + ((b * s.t + ch.t0 + i) * s.h + h) * P; };
          auto dB_of = [&](int64_t i) { return dB_h + (ch.t0 + i) * 2 * N; };
          // dS_prev = exp(cs_last) dS + sum_i exp(cs_i) dy_i C_i^T (from the old dS).
          const double last = ch.cs[len - 1];
          const float elast = static_cast<float>(std::exp(last));
          for (int64_t m = 0; m < PN; ++m) dS_prev[m] = elast * dS[m];
          // The state term: S_end's dependence on S_0, x, B, dt, cs.
          double r0 = 0.0;
          for (int64_t m = 0; m < PN; ++m) r0 += static_cast<double>(dS[m]) * S0[m];
          dcs[len - 1] += elast * r0;
          for (int64_t j = 0; j < len; ++j) {
            const float e = static_cast<float>(std::exp(last - ch.cs[j]));
            const float edt = e * static_cast<float>(ch.dt[j]);
            const float* xj = ch.x[j];
            float* dBj = dB_of(j);
            float r = 0.0f;  // x_j^T dS B_j
            for (int64_t p = 0; p < P; ++p) {
              const float u = dot(dS.data() + p * N, ch.B[j], N);  // (dS B_j)[p]
              dx[j * P + p] += edt * u;
              r += xj[p] * u;
              for (int64_t n = 0; n < N; ++n) dBj[n] += edt * dS[p * N + n] * xj[p];
            }
            ddt[j] += e * r;
            dcs[len - 1] += static_cast<double>(e * r) * ch.dt[j];
            dcs[j] -= static_cast<double>(e * r) * ch.dt[j];
          }
          for (int64_t i = 0; i < len; ++i) {
            const float* gi = g_of(i);
            const float* Ci = ch.C[i];
            float* dCi = dB_of(i) + N;
            const float ei = static_cast<float>(std::exp(ch.cs[i]));
            // y_i's term exp(cs_i) S_0 C_i
            float gv = 0.0f;  // dy_i . S_0 C_i
            for (int64_t p = 0; p < P; ++p) {
              const float* Sp = S0 + p * N;
              gv += gi[p] * dot(Sp, Ci, N);
              for (int64_t n = 0; n < N; ++n) {
                dCi[n] += ei * gi[p] * Sp[n];
                dS_prev[p * N + n] += ei * gi[p] * Ci[n];
              }
            }
            dcs[i] += static_cast<double>(ei * gv);
            // D x_i
            for (int64_t p = 0; p < P; ++p) dx[i * P + p] += static_cast<float>(hp.D) * gi[p];
            dD += dot(gi, ch.x[i], P);
            // sum_{j<=i} exp(cs_i - cs_j) dt_j (C_i . B_j) x_j
            for (int64_t j = 0; j <= i; ++j) {
              const float L = static_cast<float>(std::exp(ch.cs[i] - ch.cs[j]));
              const float dtj = static_cast<float>(ch.dt[j]);
              const float cb = dot(Ci, ch.B[j], N), gx = dot(gi, ch.x[j], P);
              const float w = L * dtj * cb;
              for (int64_t p = 0; p < P; ++p) dx[j * P + p] += w * gi[p];
              const float c = gx * L * dtj;
              float* dBj = dB_of(j);
              for (int64_t n = 0; n < N; ++n) {
                dCi[n] += c * ch.B[j][n];
                dBj[n] += c * Ci[n];
              }
              ddt[j] += gx * L * cb;
              dcs[i] += static_cast<double>(gx * w);
              dcs[j] -= static_cast<double>(gx * w);
            }
          }
          // cs_i = sum_{k<=i} a_k: da_k = sum_{i>=k} dcs_i; a = dt A.
          double da = 0.0;
          for (int64_t i = len - 1; i >= 0; --i) {
            da += dcs[i];
            const double dtot = ddt[i] + da * hp.A;
            dA += da * ch.dt[i];
            const double dv = dtot * dt_grad(ch.v[i], s.attrs.dt_softplus);
            store(ddt_in, (b * s.t + ch.t0 + i) * s.h + h, static_cast<float>(dv));
            dbias += dv;
            store_row(dxbc.data, dxbc.dtype, ix.x(ch.t0 + i), P, dx.data() + i * P);
          }
          std::swap(dS, dS_prev);
        }
        dparams[bh * 3 + 0] = hp.A * dA;
        dparams[bh * 3 + 1] = dD;
        dparams[bh * 3 + 2] = dbias;
      }
      // dB, dC of each (b, t, g): the sum over the group's heads.
#pragma omp for schedule(static)
      for (int64_t r = 0; r < s.b * s.t * s.g; ++r) {
        const int64_t b = r / (s.t * s.g), t = (r / s.g) % s.t, g = r % s.g;
        std::vector<float> acc(static_cast<size_t>(2 * N), 0.0f);
        for (int64_t hl = 0; hl < hg; ++hl) {
          const float* src = dbc.data() + ((b * s.h + g * hg + hl) * s.t + t) * 2 * N;
          for (int64_t n = 0; n < 2 * N; ++n) acc[n] += src[n];
        }
        store_row(dxbc.data, dxbc.dtype, r * (hg * P + 2 * N) + hg * P, 2 * N, acc.data());
      }
    }
    for (int64_t h = 0; h < s.h; ++h) {
      double a = 0.0, d = 0.0, bias = 0.0;
      for (int64_t b = 0; b < s.b; ++b) {
        a += dparams[(b * s.h + h) * 3 + 0];
        d += dparams[(b * s.h + h) * 3 + 1];
        bias += dparams[(b * s.h + h) * 3 + 2];
      }
      f32_mut(call->outputs[2])[h] += static_cast<float>(a);
      if (present(call->outputs[3])) f32_mut(call->outputs[3])[h] += static_cast<float>(d);
      if (present(call->outputs[4])) f32_mut(call->outputs[4])[h] += static_cast<float>(bias);
    }
  });
}

LOOM_CPU_FAST_END

bool ssd_scan_supports(const OpCall* c) {
  return passes([&] { check_scan(c, true); });
}
bool ssd_scan_fast_supports(const OpCall* c) { return cpu_has_avx2() && ssd_scan_supports(c); }
bool ssd_scan_bwd_supports(const OpCall* c) {
  return passes([&] { check_scan_bwd(c, true); });
}
bool ssd_scan_bwd_fast_supports(const OpCall* c) {
  return cpu_has_avx2() && ssd_scan_bwd_supports(c);
}
// The recurrence's FLOPs: per step and head, the state update and y = S C (2 multiply-adds
// per state element) and D x; the gradient about three times that. The chunked form trades
// some of them for the quadratic term, whose count depends on the chunk size.
Status ssd_scan_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    SsdScanShape s = check_scan(c, true);
    *out = io_cost(c, 4.0 * static_cast<double>(s.b * s.t * s.h) * static_cast<double>(s.p * s.n));
  });
}
Status ssd_scan_bwd_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    SsdScanShape s = check_scan_bwd(c, true);
    *out = io_cost(c, 12.0 * static_cast<double>(s.b * s.t * s.h) * static_cast<double>(s.p * s.n));
  });
}

}  // namespace

void add_ssd_scan_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kSsdScan, ssd_scan);
  LOOM_CPU_REGISTER(out, ops::kSsdScanBwd, ssd_scan_bwd);
}

}  // namespace loom::kernels::cpu
