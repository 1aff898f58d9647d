// add, bias_add, bias_grad, cast, scale, sumsq, sumsq_multi, amax (loom/ops.h, "Elementwise").
//   reference: one element at a time.
//   fast: OpenMP over chunks, each chunk converted to f32, computed with AVX2, stored back.
// add and cast also take f64 (loom/ops/elementwise.h): add with A, B, Y all f64 adds in f64;
// cast to f64 is exact, from f64 rounds to f32 (then to bf16 / f16). Both kernels do it one
// element at a time (the fast one over OpenMP threads); they are registered under f64 too.
#include <immintrin.h>
#include <loom/cpp/op_checks/elementwise.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kChunk = 2048;  // elements per task: fits L1 as f32, amortises scheduling

// ---- add: Y = A + B ---------------------------------------------------------------------

int64_t check_add(const OpCall* call, bool shapes_only) {
  return op_checks::check_add(call, shapes_only, DeviceType::kCpu);
}

// Y = A + B, all f64 (the checks admit f64 only for all three).
template <bool kParallel>
void add_f64(const TensorView& A, const TensorView& B, const TensorView& Y, int64_t n) {
  const double *a = static_cast<const double*>(A.data), *b = static_cast<const double*>(B.data);
  double* y = static_cast<double*>(Y.data);
#pragma omp parallel for schedule(static) if (kParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

Status add_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_add(call, false);
    const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
    if (A.dtype == DType::kF64) return add_f64<false>(A, B, Y, n);
    for (int64_t i = 0; i < n; ++i) store(Y, i, load(A, i) + load(B, i));
  });
}

// ---- bias_add: Y[n, c] += bias[c] -------------------------------------------------------

void check_bias_add(const OpCall* call, bool shapes_only) {
  op_checks::check_bias_add(call, shapes_only, DeviceType::kCpu);
}

Status bias_add_ref(const OpCall* call) {
  return guard([&] {
    check_bias_add(call, false);
    const TensorView &bias = call->inputs[0], &Y = call->outputs[0];
    int64_t C = last_dim(Y), N = rows_of(Y);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) store(Y, n * C + c, load(Y, n * C + c) + load(bias, c));
  });
}

// ---- bias_grad: dbias[c] += sum_n dY[n, c] ---------------------------------------------

void check_bias_grad(const OpCall* call, bool shapes_only) {
  op_checks::check_bias_grad(call, shapes_only, DeviceType::kCpu);
}

Status bias_grad_ref(const OpCall* call) {
  return guard([&] {
    check_bias_grad(call, false);
    const TensorView &dY = call->inputs[0], &db = call->outputs[0];
    int64_t C = last_dim(dY), N = rows_of(dY);
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t n = 0; n < N; ++n) acc += load(dY, n * C + c);
      f32_mut(db)[c] += static_cast<float>(acc);
    }
  });
}

// ---- cast: Y = X in Y's dtype ----------------------------------------------------------

int64_t check_cast(const OpCall* call, bool shapes_only) {
  return op_checks::check_cast(call, shapes_only, DeviceType::kCpu);
}

// A cast with f64 on either side: element i of X as f64 (exact), stored in Y's dtype
// (f64 -> f32 rounds once, -> bf16 / f16 through f32).
template <bool kParallel>
void cast_f64(const TensorView& X, const TensorView& Y, int64_t n) {
  const bool x64 = X.dtype == DType::kF64, y64 = Y.dtype == DType::kF64;
  const double* xd = static_cast<const double*>(X.data);
  double* yd = static_cast<double*>(Y.data);
#pragma omp parallel for schedule(static) if (kParallel)
  for (int64_t i = 0; i < n; ++i) {
    const double v = x64 ? xd[i] : static_cast<double>(load(X, i));
    if (y64)
      yd[i] = v;
    else
      store(Y, i, static_cast<float>(v));
  }
}

Status cast_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_cast(call, false);
    if (call->inputs[0].dtype == DType::kF64 || call->outputs[0].dtype == DType::kF64)
      return cast_f64<false>(call->inputs[0], call->outputs[0], n);
    for (int64_t i = 0; i < n; ++i) store(call->outputs[0], i, load(call->inputs[0], i));
  });
}

// ---- scale: Y = alpha * X --------------------------------------------------------------

int64_t check_scale(const OpCall* call, bool shapes_only) {
  return op_checks::check_scale(call, shapes_only, DeviceType::kCpu);
}

Status scale_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_scale(call, false);
    float alpha = static_cast<const ops::ScaleAttrs*>(call->attrs)->alpha;
    for (int64_t i = 0; i < n; ++i) store(call->outputs[0], i, alpha * load(call->inputs[0], i));
  });
}

// ---- sumsq: out += sum X^2 in f64 ------------------------------------------------------

int64_t check_sumsq(const OpCall* call, bool shapes_only) {
  return op_checks::check_sumsq(call, shapes_only, DeviceType::kCpu);
}

Status sumsq_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_sumsq(call, false);
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      double x = load(call->inputs[0], i);
      acc += x * x;
    }
    static_cast<double*>(call->outputs[0].data)[0] += acc;
  });
}

// ---- amax: out = max(out, max |X|) in f32, NaN propagating -----------------------------

int64_t check_amax(const OpCall* call, bool shapes_only) {
  return op_checks::check_amax(call, shapes_only, DeviceType::kCpu);
}

// max(a, b) where a NaN on either side wins (std::max and fmax drop NaN).
inline float nan_max(float a, float b) { return a > b || std::isnan(a) ? a : b; }

Status amax_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_amax(call, false);
    float* out = f32_mut(call->outputs[0]);
    float r = out[0];
    for (int64_t i = 0; i < n; ++i) r = nan_max(r, std::fabs(load(call->inputs[0], i)));
    out[0] = r;
  });
}

// ---- fast paths ---------------------------------------------------------------------

LOOM_CPU_FAST_BEGIN

Status add_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_add(call, false);
    const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
    if (A.dtype == DType::kF64) return add_f64<true>(A, B, Y, n);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) {
      float a[kChunk], b[kChunk];
      int64_t len = std::min(kChunk, n - c);
      load_row(A.data, A.dtype, c, len, a);
      load_row(B.data, B.dtype, c, len, b);
      int64_t i = 0;
      for (; i + 8 <= len; i += 8)
        _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
      for (; i < len; ++i) a[i] += b[i];
      store_row(Y.data, Y.dtype, c, len, a);
    }
  });
}

Status bias_add_fast(const OpCall* call) {
  return guard([&] {
    check_bias_add(call, false);
    const TensorView &bias = call->inputs[0], &Y = call->outputs[0];
    int64_t C = last_dim(Y), N = rows_of(Y);
    std::vector<float> b(static_cast<size_t>(C));
    load_row(bias.data, bias.dtype, 0, C, b.data());
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        load_row(Y.data, Y.dtype, n * C, C, row.data());
        simd::axpy(1.0f, b.data(), row.data(), C);
        store_row(Y.data, Y.dtype, n * C, C, row.data());
      }
    }
  });
}

Status bias_grad_fast(const OpCall* call) {
  return guard([&] {
    check_bias_grad(call, false);
    const TensorView &dY = call->inputs[0], &db = call->outputs[0];
    int64_t C = last_dim(dY), N = rows_of(dY);
    constexpr int64_t kCols = 256;  // each task owns a column block: no reduction races
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += kCols) {
      float acc[kCols] = {}, row[kCols];
      int64_t len = std::min(kCols, C - c0);
      for (int64_t n = 0; n < N; ++n) {
        load_row(dY.data, dY.dtype, n * C + c0, len, row);
        simd::axpy(1.0f, row, acc, len);
      }
      simd::axpy(1.0f, acc, f32_mut(db) + c0, len);
    }
  });
}

Status cast_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_cast(call, false);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    if (X.dtype == DType::kF64 || Y.dtype == DType::kF64) return cast_f64<true>(X, Y, n);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) {
      float x[kChunk];
      int64_t len = std::min(kChunk, n - c);
      load_row(X.data, X.dtype, c, len, x);
      store_row(Y.data, Y.dtype, c, len, x);
    }
  });
}

Status scale_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_scale(call, false);
    float alpha = static_cast<const ops::ScaleAttrs*>(call->attrs)->alpha;
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) {
      float x[kChunk];
      int64_t len = std::min(kChunk, n - c);
      load_row(X.data, X.dtype, c, len, x);
      simd::scal(alpha, x, len);
      store_row(Y.data, Y.dtype, c, len, x);
    }
  });
}

// Each chunk's sum goes to its own slot and the slots are added in order afterwards: the
// result is the same bits for every thread count and schedule (an OpenMP reduction adds the
// threads' partial sums in the order they finish, which differed run to run on a 16-core
// machine: the gradient norm, and with it clipping, were not reproducible there).
Status sumsq_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_sumsq(call, false);
    const TensorView& X = call->inputs[0];
    std::vector<double> partial(static_cast<size_t>((n + kChunk - 1) / kChunk));
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) {
      float x[kChunk];
      int64_t len = std::min(kChunk, n - c);
      load_row(X.data, X.dtype, c, len, x);
      __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
      int64_t i = 0;
      for (; i + 8 <= len; i += 8) {
        __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        acc0 = _mm256_fmadd_pd(lo, lo, acc0);
        acc1 = _mm256_fmadd_pd(hi, hi, acc1);
      }
      double part[4];
      _mm256_storeu_pd(part, _mm256_add_pd(acc0, acc1));
      double s = part[0] + part[1] + part[2] + part[3];
      for (; i < len; ++i) s += static_cast<double>(x[i]) * x[i];
      partial[static_cast<size_t>(c / kChunk)] = s;
    }
    double total = 0.0;
    for (double s : partial) total += s;
    static_cast<double*>(call->outputs[0].data)[0] += total;
  });
}

// The bit patterns of non-negative floats order as the floats do, and every NaN's lies above
// +inf's: an unsigned max over the bits of |x| is a max that propagates NaN.
Status amax_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_amax(call, false);
    if (n == 0) return;  // out[0] unchanged
    const TensorView& X = call->inputs[0];
    uint32_t bits = 0;  // +0.0f
#pragma omp parallel for schedule(static) reduction(max : bits)
    for (int64_t c = 0; c < n; c += kChunk) {
      float x[kChunk];
      int64_t len = std::min(kChunk, n - c);
      load_row(X.data, X.dtype, c, len, x);
      const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
      __m256i acc = _mm256_setzero_si256();
      int64_t i = 0;
      for (; i + 8 <= len; i += 8)
        acc = _mm256_max_epu32(
            acc, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)),
                                  abs_mask));
      uint32_t lanes[8];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), acc);
      uint32_t m = 0;
      for (uint32_t lane : lanes) m = std::max(m, lane);
      for (; i < len; ++i) {
        uint32_t b;
        std::memcpy(&b, x + i, sizeof(b));
        m = std::max(m, b & 0x7fffffffu);
      }
      bits = std::max(bits, m);
    }
    float amax;
    std::memcpy(&amax, &bits, sizeof(amax));
    float* out = f32_mut(call->outputs[0]);
    out[0] = nan_max(out[0], amax);
  });
}

LOOM_CPU_FAST_END

// ---- sumsq_multi: sumsq over each input in order --------------------------------------

int64_t check_sumsq_multi(const OpCall* call, bool shapes_only) {
  return op_checks::check_sumsq_multi(call, shapes_only, DeviceType::kCpu);
}

// sumsq (`each`: its ref or fast kernel) on X_i, i = 0 .. K-1, into the one out[0].
Status sumsq_multi_run(const OpCall* call, Status (*each)(const OpCall*)) {
  return guard([&] {
    check_sumsq_multi(call, false);
    for (int32_t i = 0; i < call->num_inputs; ++i) {
      OpCall one{sizeof(OpCall), &call->inputs[i], 1, call->outputs, 1, nullptr, 0,
                 nullptr,        nullptr,          0};
      throw_if_error(each(&one));
    }
  });
}

Status sumsq_multi_ref(const OpCall* call) { return sumsq_multi_run(call, sumsq_ref); }
Status sumsq_multi_fast(const OpCall* call) { return sumsq_multi_run(call, sumsq_fast); }

// ---- registration ---------------------------------------------------------------------

LOOM_CPU_HOOKS(add, check_add, 1)
LOOM_CPU_HOOKS(bias_add, check_bias_add, 1)
LOOM_CPU_HOOKS(bias_grad, check_bias_grad, 1)
LOOM_CPU_HOOKS(cast, check_cast, 0)
LOOM_CPU_HOOKS(scale, check_scale, 1)
LOOM_CPU_HOOKS(sumsq, check_sumsq, 2)
// sumsq_multi's cost counts every tensor (the hooks above count the largest).
bool sumsq_multi_supports(const OpCall* c) {
  return passes([&] { check_sumsq_multi(c, true); });
}
bool sumsq_multi_fast_supports(const OpCall* c) {
  return cpu_has_avx2() && sumsq_multi_supports(c);
}
Status sumsq_multi_cost(const OpCall* c, OpCost* out) {
  return guard([&] { *out = io_cost(c, 2.0 * static_cast<double>(check_sumsq_multi(c, true))); });
}
LOOM_CPU_HOOKS(amax, check_amax, 1)

}  // namespace

void add_elementwise_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kAdd, add);
  LOOM_CPU_REGISTER(out, ops::kBiasAdd, bias_add);
  LOOM_CPU_REGISTER(out, ops::kBiasGrad, bias_grad);
  LOOM_CPU_REGISTER(out, ops::kCast, cast);
  // f64 keys of add and cast (the fp64 router's; the kernels above serve f64 calls).
  add_kernels(out, ops::kAdd, kRefName, kRefPriority, add_ref, add_supports, add_cost,
              {DType::kF64});
  add_kernels(out, ops::kAdd, kFastName, kFastPriority, add_fast, add_fast_supports, add_cost,
              {DType::kF64});
  add_kernels(out, ops::kCast, kRefName, kRefPriority, cast_ref, cast_supports, cast_cost,
              {DType::kF64});
  add_kernels(out, ops::kCast, kFastName, kFastPriority, cast_fast, cast_fast_supports, cast_cost,
              {DType::kF64});
  LOOM_CPU_REGISTER(out, ops::kScale, scale);
  LOOM_CPU_REGISTER(out, ops::kSumSq, sumsq);
  LOOM_CPU_REGISTER(out, ops::kSumSqMulti, sumsq_multi);
  LOOM_CPU_REGISTER(out, ops::kAmax, amax);
}

}  // namespace loom::kernels::cpu
