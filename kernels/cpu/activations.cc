// gelu_fwd / gelu_bwd (exact erf or tanh approximation) and swiglu_fwd / swiglu_bwd
// (loom/ops.h). Forward and backward side by side.
//   reference: one element at a time, in f64 with the C library's erf / tanh / exp.
//   fast: OpenMP over chunks, AVX2 with a polynomial exp; Phi(x) from Abramowitz & Stegun
//         7.1.26 (|error| < 1.5e-7) written as erfc so that gelu(x) keeps its relative
//         accuracy for negative x.
#include "kernels/cpu/activations.h"

#include <immintrin.h>
#include <loom/cpp/op_checks/activations.h>

#include <algorithm>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kChunk = 2048;
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi), tanh variant
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi), normal density
constexpr double kCubic = 0.044715;

// ---- gelu -----------------------------------------------------------------------------

int64_t check_gelu_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_gelu_fwd(call, shapes_only, DeviceType::kCpu);
}
int64_t check_gelu_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_gelu_bwd(call, shapes_only, DeviceType::kCpu);
}

// gelu(x) and d gelu / dx in f64.
void gelu_ref_point(double x, bool tanh_approx, double* y, double* dy) {
  if (tanh_approx) {
    double u = kSqrt2OverPi * (x + kCubic * x * x * x);
    double t = std::tanh(u);
    *y = 0.5 * x * (1.0 + t);
    *dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
  } else {
    double phi_cdf = 0.5 * std::erfc(-x * kInvSqrt2);
    *y = x * phi_cdf;
    *dy = phi_cdf + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
  }
}

Status gelu_fwd_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_gelu_fwd(call, false);
    bool approx = static_cast<const ops::GeluAttrs*>(call->attrs)->approximate != 0;
    for (int64_t i = 0; i < n; ++i) {
      double y, dy;
      gelu_ref_point(load(call->inputs[0], i), approx, &y, &dy);
      store(call->outputs[0], i, static_cast<float>(y));
    }
  });
}

Status gelu_bwd_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_gelu_bwd(call, false);
    bool approx = static_cast<const ops::GeluAttrs*>(call->attrs)->approximate != 0;
    for (int64_t i = 0; i < n; ++i) {
      double y, dy;
      gelu_ref_point(load(call->inputs[1], i), approx, &y, &dy);
      store(call->outputs[0], i, static_cast<float>(load(call->inputs[0], i) * dy));
    }
  });
}

// ---- swiglu: Y = silu(X[:, :F]) * X[:, F:] ----------------------------------------------

using op_checks::SwigluShape;

SwigluShape check_swiglu_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_swiglu_fwd(call, shapes_only, DeviceType::kCpu);
}
SwigluShape check_swiglu_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_swiglu_bwd(call, shapes_only, DeviceType::kCpu);
}

Status swiglu_fwd_ref(const OpCall* call) {
  return guard([&] {
    SwigluShape s = check_swiglu_fwd(call, false);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t j = 0; j < s.f; ++j)
        store(Y, n * s.f + j,
              swiglu_fwd_ref_value(load(X, n * 2 * s.f + j), load(X, n * 2 * s.f + s.f + j)));
  });
}

Status swiglu_bwd_ref(const OpCall* call) {
  return guard([&] {
    SwigluShape s = check_swiglu_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &dX = call->outputs[0];
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t j = 0; j < s.f; ++j) {
        float dg, du;
        swiglu_bwd_ref_values(load(X, n * 2 * s.f + j), load(X, n * 2 * s.f + s.f + j),
                              load(dY, n * s.f + j), &dg, &du);
        store(dX, n * 2 * s.f + j, dg);
        store(dX, n * 2 * s.f + s.f + j, du);
      }
  });
}

// ---- fast paths -----------------------------------------------------------------------

LOOM_CPU_FAST_BEGIN

// tanh variant: t = tanh(sqrt(2/pi) (x + 0.044715 x^3)) = 1 - 2 / (exp(2u) + 1).
inline __m256 gelu_tanh_t(__m256 x) {
  __m256 x2 = _mm256_mul_ps(x, x);
  __m256 u =
      _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(kSqrt2OverPi)),
                    _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(kCubic)), x2,
                                                     _mm256_set1_ps(1.0f))));
  __m256 e = simd::exp(_mm256_add_ps(u, u));
  return _mm256_sub_ps(_mm256_set1_ps(1.0f),
                       _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
}

// Phi(x) (normal CDF) and the normal density phi(x).
inline __m256 normal_cdf(__m256 x, __m256* density) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 z =
      _mm256_mul_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(static_cast<float>(kInvSqrt2)));
  __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f),
                           _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), z, _mm256_set1_ps(1.0f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  __m256 g = simd::exp(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(z, z)));  // exp(-x^2/2)
  *density = _mm256_mul_ps(g, _mm256_set1_ps(static_cast<float>(kInvSqrt2Pi)));
  __m256 q = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), p), g);  // 0.5 erfc(|x|/sqrt2)
  __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), q), q, neg);
}

// In place on x (length n, padded to a multiple of 8 by the caller): y or y' * dy.
void gelu_chunk(float* x, const float* dy, int64_t n, bool approx) {
  for (int64_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i), r;
    if (approx) {
      __m256 t = gelu_tanh_t(v);
      __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
      if (dy == nullptr) {
        r = _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t));
      } else {
        __m256 x2 = _mm256_mul_ps(v, v);
        __m256 du =
            _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(kSqrt2OverPi)),
                          _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(3 * kCubic)), x2, one));
        __m256 sech2 = _mm256_fnmadd_ps(t, t, one);
        __m256 d = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(half, v), sech2), du,
                                   _mm256_mul_ps(half, _mm256_add_ps(one, t)));
        r = _mm256_mul_ps(d, _mm256_loadu_ps(dy + i));
      }
    } else {
      __m256 density;
      __m256 cdf = normal_cdf(v, &density);
      if (dy == nullptr)
        r = _mm256_mul_ps(v, cdf);
      else
        r = _mm256_mul_ps(_mm256_fmadd_ps(v, density, cdf), _mm256_loadu_ps(dy + i));
    }
    _mm256_storeu_ps(x + i, r);
  }
}

Status gelu_fwd_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_gelu_fwd(call, false);
    bool approx = static_cast<const ops::GeluAttrs*>(call->attrs)->approximate != 0;
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) {
      float x[kChunk] = {};
      int64_t len = std::min(kChunk, n - c);
      load_row(X.data, X.dtype, c, len, x);
      gelu_chunk(x, nullptr, (len + 7) / 8 * 8, approx);
      store_row(Y.data, Y.dtype, c, len, x);
    }
  });
}

Status gelu_bwd_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_gelu_bwd(call, false);
    bool approx = static_cast<const ops::GeluAttrs*>(call->attrs)->approximate != 0;
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &dX = call->outputs[0];
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) {
      float x[kChunk] = {}, dy[kChunk] = {};
      int64_t len = std::min(kChunk, n - c);
      load_row(X.data, X.dtype, c, len, x);
      load_row(dY.data, dY.dtype, c, len, dy);
      gelu_chunk(x, dy, (len + 7) / 8 * 8, approx);
      store_row(dX.data, dX.dtype, c, len, x);
    }
  });
}

inline __m256 sigmoid8(__m256 g) {
  __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, simd::exp(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

Status swiglu_fwd_fast(const OpCall* call) {
  return guard([&] {
    SwigluShape s = check_swiglu_fwd(call, false);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    int64_t padded = (s.f + 7) / 8 * 8;
#pragma omp parallel
    {
      std::vector<float> g(static_cast<size_t>(padded)), u(static_cast<size_t>(padded));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        load_row(X.data, X.dtype, n * 2 * s.f, s.f, g.data());
        load_row(X.data, X.dtype, n * 2 * s.f + s.f, s.f, u.data());
        swiglu_fwd_row_fast(g.data(), u.data(), padded);
        store_row(Y.data, Y.dtype, n * s.f, s.f, g.data());
      }
    }
  });
}

Status swiglu_bwd_fast(const OpCall* call) {
  return guard([&] {
    SwigluShape s = check_swiglu_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &dX = call->outputs[0];
    int64_t padded = (s.f + 7) / 8 * 8;
#pragma omp parallel
    {
      std::vector<float> g(padded), u(padded), dy(padded);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        load_row(X.data, X.dtype, n * 2 * s.f, s.f, g.data());
        load_row(X.data, X.dtype, n * 2 * s.f + s.f, s.f, u.data());
        load_row(dY.data, dY.dtype, n * s.f, s.f, dy.data());
        swiglu_bwd_row_fast(g.data(), u.data(), dy.data(), padded);
        store_row(dX.data, dX.dtype, n * 2 * s.f, s.f, g.data());
        store_row(dX.data, dX.dtype, n * 2 * s.f + s.f, s.f, u.data());
      }
    }
  });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(gelu_fwd, check_gelu_fwd, 20)
LOOM_CPU_HOOKS(gelu_bwd, check_gelu_bwd, 30)
LOOM_CPU_HOOKS(swiglu_fwd, check_swiglu_fwd, 8)
LOOM_CPU_HOOKS(swiglu_bwd, check_swiglu_bwd, 8)

}  // namespace

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

float swiglu_fwd_ref_value(double g, double u) { return static_cast<float>(g * sigmoid(g) * u); }

void swiglu_bwd_ref_values(double g, double u, double dy, float* dg, float* du) {
  const double sg = sigmoid(g);
  *dg = static_cast<float>(dy * u * sg * (1.0 + g * (1.0 - sg)));
  *du = static_cast<float>(dy * g * sg);
}

LOOM_CPU_FAST_BEGIN

void swiglu_fwd_row_fast(float* g, const float* u, int64_t padded) {
  for (int64_t j = 0; j < padded; j += 8) {
    __m256 gv = _mm256_loadu_ps(&g[j]);
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid8(gv)), _mm256_loadu_ps(&u[j]));
    _mm256_storeu_ps(&g[j], y);
  }
}

void swiglu_bwd_row_fast(float* g, float* u, const float* dy, int64_t padded) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t j = 0; j < padded; j += 8) {
    __m256 gv = _mm256_loadu_ps(&g[j]), uv = _mm256_loadu_ps(&u[j]);
    __m256 d = _mm256_loadu_ps(&dy[j]), sg = sigmoid8(gv);
    // dgate = dy * u * s * (1 + g (1 - s)); dup = dy * g * s
    __m256 dgate = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, uv), sg),
                                 _mm256_fmadd_ps(gv, _mm256_sub_ps(one, sg), one));
    _mm256_storeu_ps(&u[j], _mm256_mul_ps(_mm256_mul_ps(d, gv), sg));
    _mm256_storeu_ps(&g[j], dgate);
  }
}

LOOM_CPU_FAST_END

void add_activation_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kGeluFwd, gelu_fwd);
  LOOM_CPU_REGISTER(out, ops::kGeluBwd, gelu_bwd);
  LOOM_CPU_REGISTER(out, ops::kSwigluFwd, swiglu_fwd);
  LOOM_CPU_REGISTER(out, ops::kSwigluBwd, swiglu_bwd);
}

}  // namespace loom::kernels::cpu
