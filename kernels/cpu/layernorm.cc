// layernorm_fwd / layernorm_bwd over the last dimension (loom/ops.h).
//   Y = (X - mean) * rstd * gamma + beta, gamma = weight (+ 1 with zero_centered_gamma).
//   dX = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dY * gamma, xhat = (X - mean) rstd
//   reference: row by row in f64.
//   fast: OpenMP over rows, AVX2 within a row; weight gradients summed in per-thread f32
//         partials and reduced in thread order (deterministic for a given thread count).
#include <loom/cpp/op_checks/norms.h>
#include <omp.h>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::NormShape;

NormShape check_layernorm_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_layernorm_fwd(call, shapes_only, DeviceType::kCpu);
}
NormShape check_layernorm_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_layernorm_bwd(call, shapes_only, DeviceType::kCpu);
}

Status layernorm_fwd_ref(const OpCall* call) {
  return guard([&] {
    NormShape s = check_layernorm_fwd(call, false);
    const TensorView &X = call->inputs[0], &W = call->inputs[1], &B = call->inputs[2];
    const TensorView& Y = call->outputs[0];
    float gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
    for (int64_t n = 0; n < s.n; ++n) {
      double mean = 0.0, var = 0.0;
      for (int64_t c = 0; c < s.c; ++c) mean += load(X, n * s.c + c);
      mean /= static_cast<double>(s.c);
      for (int64_t c = 0; c < s.c; ++c) {
        double d = load(X, n * s.c + c) - mean;
        var += d * d;
      }
      var /= static_cast<double>(s.c);
      double rstd = 1.0 / std::sqrt(var + s.attrs.eps);
      for (int64_t c = 0; c < s.c; ++c) {
        double y = (load(X, n * s.c + c) - mean) * rstd * (load(W, c) + gamma_shift);
        if (B.data != nullptr) y += load(B, c);
        store(Y, n * s.c + c, static_cast<float>(y));
      }
      f32_mut(call->outputs[1])[n] = static_cast<float>(mean);
      f32_mut(call->outputs[2])[n] = static_cast<float>(rstd);
    }
  });
}

Status layernorm_bwd_ref(const OpCall* call) {
  return guard([&] {
    NormShape s = check_layernorm_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &W = call->inputs[2];
    const float *mean = f32(call->inputs[3]), *rstd = f32(call->inputs[4]);
    const TensorView& dX = call->outputs[0];
    float* dw = f32_mut(call->outputs[1]);
    float* db = f32_mut(call->outputs[2]);  // null when not wanted
    float gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
    std::vector<double> dw_acc(static_cast<size_t>(s.c)), db_acc(static_cast<size_t>(s.c));
    for (int64_t n = 0; n < s.n; ++n) {
      double mg = 0.0, mgx = 0.0;
      for (int64_t c = 0; c < s.c; ++c) {
        double xhat = (load(X, n * s.c + c) - mean[n]) * static_cast<double>(rstd[n]);
        double dy = load(dY, n * s.c + c), g = dy * (static_cast<double>(load(W, c)) + gamma_shift);
        mg += g;
        mgx += g * xhat;
        dw_acc[c] += dy * xhat;
        db_acc[c] += dy;
      }
      mg /= static_cast<double>(s.c);
      mgx /= static_cast<double>(s.c);
      for (int64_t c = 0; c < s.c; ++c) {
        double xhat = (load(X, n * s.c + c) - mean[n]) * static_cast<double>(rstd[n]);
        // g exactly as above, in f64: a product rounded to f32 here but not there would leave
        // g - mean(g) = its rounding error (times rstd, 316 at eps 1e-5) where it must be 0
        // (C = 1: xhat = 0 and mean(g) = g).
        double g = static_cast<double>(load(dY, n * s.c + c)) *
                   (static_cast<double>(load(W, c)) + gamma_shift);
        store(dX, n * s.c + c, static_cast<float>(rstd[n] * (g - mg - xhat * mgx)));
      }
    }
    for (int64_t c = 0; c < s.c; ++c) {
      dw[c] += static_cast<float>(dw_acc[c]);
      if (db != nullptr) db[c] += static_cast<float>(db_acc[c]);
    }
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

Status layernorm_fwd_fast(const OpCall* call) {
  return guard([&] {
    NormShape s = check_layernorm_fwd(call, false);
    const TensorView &X = call->inputs[0], &B = call->inputs[2], &Y = call->outputs[0];
    std::vector<float> gamma = gamma_f32(call->inputs[1], s.c, s.attrs.zero_centered_gamma);
    std::vector<float> beta(static_cast<size_t>(s.c), 0.0f);
    if (B.data != nullptr) load_row(B.data, B.dtype, 0, s.c, beta.data());
    float* mean_out = f32_mut(call->outputs[1]);
    float* rstd_out = f32_mut(call->outputs[2]);
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.c));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        float* x = row.data();
        load_row(X.data, X.dtype, n * s.c, s.c, x);
        float mean = simd::sum(x, s.c) / static_cast<float>(s.c);
        __m256 vm = _mm256_set1_ps(mean), acc = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 8 <= s.c; c += 8) {
          __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + c), vm);
          acc = _mm256_fmadd_ps(d, d, acc);
        }
        float var = simd::hsum(acc);
        for (; c < s.c; ++c) var += (x[c] - mean) * (x[c] - mean);
        float rstd = 1.0f / std::sqrt(var / static_cast<float>(s.c) + s.attrs.eps);
        __m256 vr = _mm256_set1_ps(rstd);
        for (c = 0; c + 8 <= s.c; c += 8) {
          __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm), vr);
          _mm256_storeu_ps(
              x + c, _mm256_fmadd_ps(xh, _mm256_loadu_ps(&gamma[c]), _mm256_loadu_ps(&beta[c])));
        }
        for (; c < s.c; ++c) x[c] = (x[c] - mean) * rstd * gamma[c] + beta[c];
        store_row(Y.data, Y.dtype, n * s.c, s.c, x);
        mean_out[n] = mean;
        rstd_out[n] = rstd;
      }
    }
  });
}

Status layernorm_bwd_fast(const OpCall* call) {
  return guard([&] {
    NormShape s = check_layernorm_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &dX = call->outputs[0];
    const float *mean = f32(call->inputs[3]), *rstd = f32(call->inputs[4]);
    std::vector<float> gamma = gamma_f32(call->inputs[2], s.c, s.attrs.zero_centered_gamma);
    int threads = omp_get_max_threads();
    // (threads, 2, C): per-thread partial dweight and dbias
    std::vector<float> partial(static_cast<size_t>(threads) * 2 * s.c, 0.0f);
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> xrow(static_cast<size_t>(s.c)), grow(static_cast<size_t>(s.c));
      float* dw = partial.data() + omp_get_thread_num() * 2 * s.c;
      float* db = dw + s.c;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        float *x = xrow.data(), *dy = grow.data();
        load_row(X.data, X.dtype, n * s.c, s.c, x);
        load_row(dY.data, dY.dtype, n * s.c, s.c, dy);
        __m256 vm = _mm256_set1_ps(mean[n]), vr = _mm256_set1_ps(rstd[n]);
        __m256 sg = _mm256_setzero_ps(), sgx = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 8 <= s.c; c += 8) {
          __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm), vr);
          __m256 d = _mm256_loadu_ps(dy + c), g = _mm256_mul_ps(d, _mm256_loadu_ps(&gamma[c]));
          sg = _mm256_add_ps(sg, g);
          sgx = _mm256_fmadd_ps(g, xh, sgx);
          _mm256_storeu_ps(dw + c, _mm256_fmadd_ps(d, xh, _mm256_loadu_ps(dw + c)));
          _mm256_storeu_ps(db + c, _mm256_add_ps(d, _mm256_loadu_ps(db + c)));
          _mm256_storeu_ps(x + c, xh);  // x now holds xhat
          _mm256_storeu_ps(dy + c, g);  // dy now holds g
        }
        float mg = simd::hsum(sg), mgx = simd::hsum(sgx);
        for (; c < s.c; ++c) {
          float xh = (x[c] - mean[n]) * rstd[n], g = dy[c] * gamma[c];
          mg += g;
          mgx += g * xh;
          dw[c] += dy[c] * xh;
          db[c] += dy[c];
          x[c] = xh;
          dy[c] = g;
        }
        mg /= static_cast<float>(s.c);
        mgx /= static_cast<float>(s.c);
        __m256 vmg = _mm256_set1_ps(mg), vmgx = _mm256_set1_ps(mgx);
        for (c = 0; c + 8 <= s.c; c += 8) {
          __m256 t = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(dy + c), vmg),
                                   _mm256_mul_ps(_mm256_loadu_ps(x + c), vmgx));
          _mm256_storeu_ps(x + c, _mm256_mul_ps(vr, t));
        }
        for (; c < s.c; ++c) x[c] = rstd[n] * (dy[c] - mg - x[c] * mgx);
        store_row(dX.data, dX.dtype, n * s.c, s.c, x);
      }
    }
    float* dw_out = f32_mut(call->outputs[1]);
    float* db_out = f32_mut(call->outputs[2]);
    for (int t = 0; t < threads; ++t) {
      simd::axpy(1.0f, partial.data() + t * 2 * s.c, dw_out, s.c);
      if (db_out != nullptr) simd::axpy(1.0f, partial.data() + (t * 2 + 1) * s.c, db_out, s.c);
    }
  });
}

LOOM_CPU_FAST_END

// Forward ~8 flops per element, backward ~14 (MFU counts norms as their arithmetic).
LOOM_CPU_HOOKS(layernorm_fwd, check_layernorm_fwd, 8)
LOOM_CPU_HOOKS(layernorm_bwd, check_layernorm_bwd, 14)

}  // namespace

void add_layernorm_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kLayerNormFwd, layernorm_fwd);
  LOOM_CPU_REGISTER(out, ops::kLayerNormBwd, layernorm_bwd);
}

}  // namespace loom::kernels::cpu
