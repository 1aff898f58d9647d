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
// fast: the chunked SSD form in f32 GEMMs (OpenBLAS), OpenMP over (b, h); CB = C B^T of each
// (b, group, chunk) is computed once and shared by the group's heads. Within a chunk of Q steps
// (chunk_size, at most 256), with cs_i the cumulative sum of a over the chunk up to step i and
// S_0 the state entering it:
//   y_i = exp(cs_i) S_0 C_i + sum_{j <= i} exp(cs_i - cs_j) dt_j (C_i . B_j) x_j + D x_i
//   S_end = exp(cs_last) S_0 + sum_j exp(cs_last - cs_j) dt_j x_j B_j^T
// and its gradient differentiates exactly these two lines per chunk, last chunk first, with
// the chunk-entry states of a forward pass and dS carried between chunks; the gradients of
// the cs_i turn into those of the a_k by a reverse cumulative sum.
#include <cblas.h>
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

// ---- fast: chunked, GEMM form -------------------------------------------------------------

LOOM_CPU_FAST_BEGIN

// The chunk length of the fast kernels: chunk_size (it only tiles the work: any value gives
// the same function), at most T and at most 256 (the (L, L) scratch grows with it).
int64_t fast_chunk(const SsdScanShape& s) {
  return std::max<int64_t>(1, std::min<int64_t>({s.attrs.chunk_size, s.t, 256}));
}

// Row-major single-precision GEMM: C (m, n) = alpha op(A) op(B) + beta C.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// CB of every (b, g, chunk): C (len, N) @ B^T (N, len), shared by the group's heads;
// (B, G, chunks, L, L), rows and columns past a short last chunk unused.
std::vector<float> chunk_cb(const float* xbc, const SsdScanShape& s, int64_t L) {
  const int64_t N = s.n, chunks = (s.t + L - 1) / L, hg = s.h / s.g;
  const int64_t row = hg * s.p + 2 * N, ld = s.g * row;  // ld: one step to the next
  std::vector<float> cb(static_cast<size_t>(s.b * s.g * chunks * L * L));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s.b * s.g * chunks; ++r) {
    const int64_t b = r / (s.g * chunks), g = (r / chunks) % s.g, k = r % chunks;
    const int64_t t0 = k * L, len = std::min(L, s.t - t0);
    const float* Bp = xbc + ((b * s.t + t0) * s.g + g) * row + hg * s.p;
    sgemm(false, true, len, len, N, 1.0f, Bp + N, ld, Bp, ld, 0.0f, cb.data() + r * L * L, L);
  }
  return cb;
}

// The per-chunk scalars of one (b, h): v = dt_in + bias, dt, cs (the cumulative sum of
// dt * A), e_i = exp(cs_i), w_j = exp(cs_last - cs_j) dt_j, el = exp(cs_last), and the
// causal decay matrix Lm_ij = exp(cs_i - cs_j) (j <= i; 0 above the diagonal), (L, L).
struct ChunkScalars {
  int64_t t0 = 0, len = 0;
  std::vector<double> v, dt, cs;
  std::vector<float> e, w, Lm;
  float el = 1.0f;

  explicit ChunkScalars(int64_t L)
      : v(static_cast<size_t>(L)),
        dt(static_cast<size_t>(L)),
        cs(static_cast<size_t>(L)),
        e(static_cast<size_t>(L)),
        w(static_cast<size_t>(L)),
        Lm(static_cast<size_t>(L * L)) {}

  void load(const float* dt_in, const SsdScanShape& s, int64_t b, int64_t h,
            const HeadParams& hp, int64_t start, int64_t L, bool decay_matrix) {
    t0 = start;
    len = std::min(L, s.t - start);
    double acc = 0.0, big = 0.0;
    for (int64_t i = 0; i < len; ++i) {
      v[i] = static_cast<double>(dt_in[(b * s.t + t0 + i) * s.h + h]) + hp.bias;
      dt[i] = dt_of(v[i], s.attrs.dt_softplus);
      cs[i] = acc += dt[i] * hp.A;
      big = std::max(big, std::abs(acc));
    }
    const double last = cs[len - 1];
    el = static_cast<float>(std::exp(last));
    for (int64_t i = 0; i < len; ++i) {
      e[i] = static_cast<float>(std::exp(cs[i]));
      w[i] = static_cast<float>(std::exp(last - cs[i]) * dt[i]);
    }
    if (!decay_matrix) return;
    if (big < 600.0) {  // exp(cs_i - cs_j) = exp(cs_i) / exp(cs_j), all finite in f64
      double ed[256], inv[256];
      for (int64_t i = 0; i < len; ++i) {
        ed[i] = std::exp(cs[i]);
        inv[i] = 1.0 / ed[i];
      }
      for (int64_t i = 0; i < len; ++i) {
        float* r = Lm.data() + i * L;
#pragma omp simd
        for (int64_t j = 0; j <= i; ++j) r[j] = static_cast<float>(ed[i] * inv[j]);
        for (int64_t j = i + 1; j < len; ++j) r[j] = 0.0f;
      }
    } else {
      for (int64_t i = 0; i < len; ++i) {
        float* r = Lm.data() + i * L;
        for (int64_t j = 0; j <= i; ++j) r[j] = static_cast<float>(std::exp(cs[i] - cs[j]));
        for (int64_t j = i + 1; j < len; ++j) r[j] = 0.0f;
      }
    }
  }
};

// Xw (len, P) = diag(w) X.
void scale_rows(const float* x, int64_t ldx, const float* w, int64_t len, int64_t P, float* out) {
  for (int64_t j = 0; j < len; ++j) {
    const float* xj = x + j * ldx;
    float* oj = out + j * P;
    const float wj = w[j];
#pragma omp simd
    for (int64_t p = 0; p < P; ++p) oj[p] = wj * xj[p];
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

Status ssd_scan_fast(const OpCall* call) {
  return guard([&] {
    SsdScanShape s = check_scan(call, false);
    const F32Copy xbc(call->inputs[0]), dt_in(call->inputs[1]);
    const TensorView &y = call->outputs[0], &fin = call->outputs[1];
    const int64_t P = s.p, N = s.n, L = fast_chunk(s), hg = s.h / s.g;
    const int64_t chunks = (s.t + L - 1) / L, row = hg * P + 2 * N, ld = s.g * row;
    const std::vector<float> cb = chunk_cb(xbc.data(), s, L);
#pragma omp parallel
    {
      ChunkScalars ch(L);
      std::vector<float> M(static_cast<size_t>(L * L)), Y(static_cast<size_t>(L * P)),
          Xw(static_cast<size_t>(L * P)), S(static_cast<size_t>(P * N));
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < s.b * s.h; ++bh) {
        const int64_t b = bh / s.h, h = bh % s.h, g = h / hg;
        const HeadParams hp = head_params(call, 2, h);
        const XbcIndex ix(s, b, h);
        S = initial_state(call->inputs[5], s, b, h);
        const float D = static_cast<float>(hp.D);
        for (int64_t k = 0; k < chunks; ++k) {
          ch.load(dt_in.data(), s, b, h, hp, k * L, L, true);
          const int64_t len = ch.len, t0 = ch.t0;
          const float* X = xbc.data() + ix.x(t0);
          const float* Bp = xbc.data() + ix.B(t0);
          const float* Cp = xbc.data() + ix.C(t0);
          const float* CB = cb.data() + ((b * s.g + g) * chunks + k) * L * L;
          // M = CB * Lm * dt_j (causal)
          for (int64_t i = 0; i < len; ++i) {
            const float* cbi = CB + i * L;
            const float* li = ch.Lm.data() + i * L;
            float* mi = M.data() + i * L;
#pragma omp simd
            for (int64_t j = 0; j <= i; ++j) mi[j] = cbi[j] * li[j] * static_cast<float>(ch.dt[j]);
            for (int64_t j = i + 1; j < len; ++j) mi[j] = 0.0f;
          }
          // Y = diag(e) C S^T + M X + D X
          sgemm(false, true, len, P, N, 1.0f, Cp, ld, S.data(), N, 0.0f, Y.data(), P);
          for (int64_t i = 0; i < len; ++i) {
            const float ei = ch.e[i];
            const float* xi = X + i * ld;
            float* yi = Y.data() + i * P;
#pragma omp simd
            for (int64_t p = 0; p < P; ++p) yi[p] = ei * yi[p] + D * xi[p];
          }
          sgemm(false, false, len, P, len, 1.0f, M.data(), L, X, ld, 1.0f, Y.data(), P);
          for (int64_t i = 0; i < len; ++i)
            store_row(y.data, y.dtype, ((b * s.t + t0 + i) * s.h + h) * P, P, Y.data() + i * P);
          // S = el S + (diag(w) X)^T B
          scale_rows(X, ld, ch.w.data(), len, P, Xw.data());
          sgemm(true, false, P, N, len, 1.0f, Xw.data(), P, Bp, ld, ch.el, S.data(), N);
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
    const int64_t P = s.p, N = s.n, PN = P * N, L = fast_chunk(s), hg = s.h / s.g;
    const int64_t chunks = (s.t + L - 1) / L, row = hg * P + 2 * N, ld = s.g * row;
    const int64_t ldg = s.h * P;
    const std::vector<float> cb = chunk_cb(xbc.data(), s, L);
    // dB, dC of each head (B, H, T, 2N), summed over a group's heads afterwards.
    std::vector<float> dbc(static_cast<size_t>(s.b * s.h * s.t * 2 * N));
    // Per (b, h): dA_log, dD, ddt_bias, summed over b afterwards.
    std::vector<double> dparams(static_cast<size_t>(s.b * s.h * 3), 0.0);
#pragma omp parallel
    {
      ChunkScalars ch(L);
      std::vector<float> states;  // (chunks, P, N): the state entering each chunk
      std::vector<float> S(static_cast<size_t>(PN)), dS(static_cast<size_t>(PN));
      std::vector<float> M(static_cast<size_t>(L * L)), dM(static_cast<size_t>(L * L));
      std::vector<float> Ge(static_cast<size_t>(L * P)), Xw(static_cast<size_t>(L * P)),
          dX(static_cast<size_t>(L * P)), U(static_cast<size_t>(L * P)),
          T1(static_cast<size_t>(L * N)), ddt(static_cast<size_t>(L));
      std::vector<double> dcs(static_cast<size_t>(L));
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < s.b * s.h; ++bh) {
        const int64_t b = bh / s.h, h = bh % s.h, g = h / hg;
        const HeadParams hp = head_params(call, 3, h);
        const XbcIndex ix(s, b, h);
        const float D = static_cast<float>(hp.D);
        states.resize(static_cast<size_t>(chunks * PN));
        S = initial_state(call->inputs[6], s, b, h);
        for (int64_t k = 0; k < chunks; ++k) {
          std::copy(S.begin(), S.end(), states.begin() + k * PN);
          if (k == chunks - 1) break;  // the final state is not needed
          ch.load(dt_in.data(), s, b, h, hp, k * L, L, false);
          const float* X = xbc.data() + ix.x(ch.t0);
          scale_rows(X, ld, ch.w.data(), ch.len, P, Xw.data());
          sgemm(true, false, P, N, ch.len, 1.0f, Xw.data(), P, xbc.data() + ix.B(ch.t0), ld,
                ch.el, S.data(), N);
        }
        float* dB_h = dbc.data() + bh * s.t * 2 * N;  // (T, 2N): dB then dC per step
        std::fill(dB_h, dB_h + s.t * 2 * N, 0.0f);
        std::fill(dS.begin(), dS.end(), 0.0f);  // the gradient of the chunk's final state
        double dA = 0.0, dD = 0.0, dbias = 0.0;
        for (int64_t k = chunks - 1; k >= 0; --k) {
          ch.load(dt_in.data(), s, b, h, hp, k * L, L, true);
          const int64_t len = ch.len, t0 = ch.t0;
          const float* S0 = states.data() + k * PN;
          const float* X = xbc.data() + ix.x(t0);
          const float* Bp = xbc.data() + ix.B(t0);
          const float* Cp = xbc.data() + ix.C(t0);
          const float* G = dy.data() + ((b * s.t + t0) * s.h + h) * P;
          const float* CB = cb.data() + ((b * s.g + g) * chunks + k) * L * L;
          float* dBp = dB_h + t0 * 2 * N;
          float* dCp = dBp + N;
          std::fill(ddt.begin(), ddt.begin() + len, 0.0f);
          std::fill(dcs.begin(), dcs.begin() + len, 0.0);
          // Ge = diag(e) G, Xw = diag(w) X; M = CB * Lm * dt_j
          for (int64_t i = 0; i < len; ++i) {
            const float* gi = G + i * ldg;
            float* o = Ge.data() + i * P;
#pragma omp simd
            for (int64_t p = 0; p < P; ++p) o[p] = ch.e[i] * gi[p];
          }
          scale_rows(X, ld, ch.w.data(), len, P, Xw.data());
          for (int64_t i = 0; i < len; ++i) {
            const float* cbi = CB + i * L;
            const float* li = ch.Lm.data() + i * L;
            float* mi = M.data() + i * L;
#pragma omp simd
            for (int64_t j = 0; j <= i; ++j) mi[j] = cbi[j] * li[j] * static_cast<float>(ch.dt[j]);
            for (int64_t j = i + 1; j < len; ++j) mi[j] = 0.0f;
          }
          // The intra-chunk term M X: dM = G X^T, dX = M^T G; dM -> dCB (in place), ddt, dcs.
          sgemm(false, true, len, len, P, 1.0f, G, ldg, X, ld, 0.0f, dM.data(), L);
          sgemm(true, false, len, P, len, 1.0f, M.data(), L, G, ldg, 0.0f, dX.data(), P);
          for (int64_t i = 0; i < len; ++i) {
            const float* cbi = CB + i * L;
            const float* li = ch.Lm.data() + i * L;
            const float* mi = M.data() + i * L;
            float* dmi = dM.data() + i * L;
            double dci = 0.0;
#pragma omp simd reduction(+ : dci)
            for (int64_t j = 0; j <= i; ++j) {
              const float d = dmi[j];
              const float vm = d * mi[j];
              dci += vm;
              dcs[j] -= vm;
              ddt[j] += d * li[j] * cbi[j];
              dmi[j] = d * li[j] * static_cast<float>(ch.dt[j]);
            }
            dcs[i] += dci;
            for (int64_t j = i + 1; j < len; ++j) dmi[j] = 0.0f;
          }
          // dC += dCB B, dB += dCB^T C
          sgemm(false, false, len, N, len, 1.0f, dM.data(), L, Bp, ld, 1.0f, dCp, 2 * N);
          sgemm(true, false, len, N, len, 1.0f, dM.data(), L, Cp, ld, 1.0f, dBp, 2 * N);
          // D x
          for (int64_t i = 0; i < len; ++i) {
            const float* gi = G + i * ldg;
            const float* xi = X + i * ld;
            float* dxi = dX.data() + i * P;
#pragma omp simd
            for (int64_t p = 0; p < P; ++p) dxi[p] += D * gi[p];
            dD += dot(gi, xi, P);
          }
          // The state term diag(e) C S0^T: dC += Ge S0, dcs_i += (Ge S0)_i . C_i
          sgemm(false, false, len, N, P, 1.0f, Ge.data(), P, S0, N, 0.0f, T1.data(), N);
          for (int64_t i = 0; i < len; ++i) {
            const float* ti = T1.data() + i * N;
            const float* ci = Cp + i * ld;
            float* dci = dCp + i * 2 * N;
            dcs[i] += dot(ti, ci, N);
#pragma omp simd
            for (int64_t n = 0; n < N; ++n) dci[n] += ti[n];
          }
          if (k < chunks - 1) {
            // S_end = el S0 + Xw^T B, from the gradient dS of S_end.
            sgemm(false, true, len, P, N, 1.0f, Bp, ld, dS.data(), N, 0.0f, U.data(), P);
            for (int64_t j = 0; j < len; ++j) {
              const float* uj = U.data() + j * P;
              const float r = dot(X + j * ld, uj, P);  // x_j^T dS B_j
              float* dxj = dX.data() + j * P;
              const float wj = ch.w[j];
#pragma omp simd
              for (int64_t p = 0; p < P; ++p) dxj[p] += wj * uj[p];
              ddt[j] += static_cast<float>(std::exp(ch.cs[len - 1] - ch.cs[j])) * r;
              dcs[len - 1] += static_cast<double>(wj * r);
              dcs[j] -= static_cast<double>(wj * r);
            }
            sgemm(false, false, len, N, P, 1.0f, Xw.data(), P, dS.data(), N, 1.0f, dBp, 2 * N);
            double r0 = 0.0;
#pragma omp simd reduction(+ : r0)
            for (int64_t m = 0; m < PN; ++m) r0 += static_cast<double>(dS[m]) * S0[m];
            dcs[len - 1] += ch.el * r0;
          }
          // dS of the entering state: el dS + Ge^T C
          if (k > 0)
            sgemm(true, false, P, N, len, 1.0f, Ge.data(), P, Cp, ld, ch.el, dS.data(), N);
          // cs_i = sum_{k<=i} a_k: da_k = sum_{i>=k} dcs_i; a = dt A.
          double da = 0.0;
          for (int64_t i = len - 1; i >= 0; --i) {
            da += dcs[i];
            const double dtot = ddt[i] + da * hp.A;
            dA += da * ch.dt[i];
            const double dv = dtot * dt_grad(ch.v[i], s.attrs.dt_softplus);
            store(ddt_in, (b * s.t + t0 + i) * s.h + h, static_cast<float>(dv));
            dbias += dv;
            store_row(dxbc.data, dxbc.dtype, ix.x(t0 + i), P, dX.data() + i * P);
          }
        }
        dparams[bh * 3 + 0] = hp.A * dA;
        dparams[bh * 3 + 1] = dD;
        dparams[bh * 3 + 2] = dbias;
      }
      // dB, dC of each (b, t, g): the sum over the group's heads.
      std::vector<float> acc(static_cast<size_t>(2 * N));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < s.b * s.t * s.g; ++r) {
        const int64_t b = r / (s.t * s.g), t = (r / s.g) % s.t, g = r % s.g;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t hl = 0; hl < hg; ++hl) {
          const float* src = dbc.data() + ((b * s.h + g * hg + hl) * s.t + t) * 2 * N;
#pragma omp simd
          for (int64_t n = 0; n < 2 * N; ++n) acc[n] += src[n];
        }
        store_row(dxbc.data, dxbc.dtype, r * row + hg * P, 2 * N, acc.data());
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
