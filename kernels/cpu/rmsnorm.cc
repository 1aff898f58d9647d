// rmsnorm_fwd / rmsnorm_bwd over the last dimension (loom/ops.h).
//   Y = X * rstd * gamma, rstd = 1 / sqrt(mean(X^2) + eps), gamma = weight (+ 1 when
//   zero_centered_gamma); dX = rstd * (g - xhat * mean(g * xhat)), g = dY * gamma.
//   reference: row by row in f64.
//   fast: OpenMP over rows, AVX2 within a row, per-thread dweight partials.
#include <loom/cpp/op_checks/norms.h>
#include <omp.h>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::NormShape;

NormShape check_rmsnorm_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_rmsnorm_fwd(call, shapes_only, DeviceType::kCpu);
}
NormShape check_rmsnorm_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_rmsnorm_bwd(call, shapes_only, DeviceType::kCpu);
}

Status rmsnorm_fwd_ref(const OpCall* call) {
  return guard([&] {
    NormShape s = check_rmsnorm_fwd(call, false);
    const TensorView &X = call->inputs[0], &W = call->inputs[1], &Y = call->outputs[0];
    float gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
    for (int64_t n = 0; n < s.n; ++n) {
      double ms = 0.0;
      for (int64_t c = 0; c < s.c; ++c) {
        double x = load(X, n * s.c + c);
        ms += x * x;
      }
      double rstd = 1.0 / std::sqrt(ms / static_cast<double>(s.c) + s.attrs.eps);
      for (int64_t c = 0; c < s.c; ++c)
        store(Y, n * s.c + c,
              static_cast<float>(load(X, n * s.c + c) * rstd * (load(W, c) + gamma_shift)));
      f32_mut(call->outputs[1])[n] = static_cast<float>(rstd);
    }
  });
}

Status rmsnorm_bwd_ref(const OpCall* call) {
  return guard([&] {
    NormShape s = check_rmsnorm_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &W = call->inputs[2];
    const float* rstd = f32(call->inputs[3]);
    const TensorView& dX = call->outputs[0];
    float gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
    std::vector<double> dw_acc(static_cast<size_t>(s.c));
    for (int64_t n = 0; n < s.n; ++n) {
      double mgx = 0.0;
      for (int64_t c = 0; c < s.c; ++c) {
        double xhat = load(X, n * s.c + c) * static_cast<double>(rstd[n]);
        double dy = load(dY, n * s.c + c);
        mgx += dy * (load(W, c) + gamma_shift) * xhat;
        dw_acc[c] += dy * xhat;
      }
      mgx /= static_cast<double>(s.c);
      for (int64_t c = 0; c < s.c; ++c) {
        double xhat = load(X, n * s.c + c) * static_cast<double>(rstd[n]);
        double g = load(dY, n * s.c + c) * (load(W, c) + gamma_shift);
        store(dX, n * s.c + c, static_cast<float>(rstd[n] * (g - xhat * mgx)));
      }
    }
    for (int64_t c = 0; c < s.c; ++c) f32_mut(call->outputs[1])[c] += static_cast<float>(dw_acc[c]);
  });
}

LOOM_CPU_FAST_BEGIN

std::vector<float> gamma_f32(const TensorView& w, int64_t c, bool zero_centered) {
  std::vector<float> g(static_cast<size_t>(c));
  load_row(w.data, w.dtype, 0, c, g.data());
  if (zero_centered)
    for (float& x : g) x += 1.0f;
  return g;
}

Status rmsnorm_fwd_fast(const OpCall* call) {
  return guard([&] {
    NormShape s = check_rmsnorm_fwd(call, false);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    std::vector<float> gamma = gamma_f32(call->inputs[1], s.c, s.attrs.zero_centered_gamma);
    float* rstd_out = f32_mut(call->outputs[1]);
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.c));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        float* x = row.data();
        load_row(X.data, X.dtype, n * s.c, s.c, x);
        float rstd = 1.0f / std::sqrt(simd::dot(x, x, s.c) / static_cast<float>(s.c) + s.attrs.eps);
        __m256 vr = _mm256_set1_ps(rstd);
        int64_t c = 0;
        for (; c + 8 <= s.c; c += 8)
          _mm256_storeu_ps(x + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vr),
                                                _mm256_loadu_ps(&gamma[c])));
        for (; c < s.c; ++c) x[c] = x[c] * rstd * gamma[c];
        store_row(Y.data, Y.dtype, n * s.c, s.c, x);
        rstd_out[n] = rstd;
      }
    }
  });
}

Status rmsnorm_bwd_fast(const OpCall* call) {
  return guard([&] {
    NormShape s = check_rmsnorm_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &dX = call->outputs[0];
    const float* rstd = f32(call->inputs[3]);
    std::vector<float> gamma = gamma_f32(call->inputs[2], s.c, s.attrs.zero_centered_gamma);
    int threads = omp_get_max_threads();
    std::vector<float> partial(static_cast<size_t>(threads) * s.c, 0.0f);  // (threads, C)
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> xrow(static_cast<size_t>(s.c)), grow(static_cast<size_t>(s.c));
      float* dw = partial.data() + omp_get_thread_num() * s.c;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        float *x = xrow.data(), *g = grow.data();
        load_row(X.data, X.dtype, n * s.c, s.c, x);
        load_row(dY.data, dY.dtype, n * s.c, s.c, g);
        __m256 vr = _mm256_set1_ps(rstd[n]), sgx = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 8 <= s.c; c += 8) {
          __m256 xh = _mm256_mul_ps(_mm256_loadu_ps(x + c), vr);
          __m256 d = _mm256_loadu_ps(g + c), gv = _mm256_mul_ps(d, _mm256_loadu_ps(&gamma[c]));
          sgx = _mm256_fmadd_ps(gv, xh, sgx);
          _mm256_storeu_ps(dw + c, _mm256_fmadd_ps(d, xh, _mm256_loadu_ps(dw + c)));
          _mm256_storeu_ps(x + c, xh);
          _mm256_storeu_ps(g + c, gv);
        }
        float mgx = simd::hsum(sgx);
        for (; c < s.c; ++c) {
          float xh = x[c] * rstd[n], gv = g[c] * gamma[c];
          mgx += gv * xh;
          dw[c] += g[c] * xh;
          x[c] = xh;
          g[c] = gv;
        }
        mgx /= static_cast<float>(s.c);
        __m256 vmgx = _mm256_set1_ps(mgx);
        for (c = 0; c + 8 <= s.c; c += 8)
          _mm256_storeu_ps(x + c, _mm256_mul_ps(vr, _mm256_fnmadd_ps(_mm256_loadu_ps(x + c), vmgx,
                                                                     _mm256_loadu_ps(g + c))));
        for (; c < s.c; ++c) x[c] = rstd[n] * (g[c] - x[c] * mgx);
        store_row(dX.data, dX.dtype, n * s.c, s.c, x);
      }
    }
    for (int t = 0; t < threads; ++t)
      simd::axpy(1.0f, partial.data() + t * s.c, f32_mut(call->outputs[1]), s.c);
  });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(rmsnorm_fwd, check_rmsnorm_fwd, 4)
LOOM_CPU_HOOKS(rmsnorm_bwd, check_rmsnorm_bwd, 8)

}  // namespace

void add_rmsnorm_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kRmsNormFwd, rmsnorm_fwd);
  LOOM_CPU_REGISTER(out, ops::kRmsNormBwd, rmsnorm_bwd);
}

}  // namespace loom::kernels::cpu
