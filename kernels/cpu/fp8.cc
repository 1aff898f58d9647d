// fp8_quantize, fp8_gemm, fp8_scale_update (loom/ops.h, "FP8").
//   reference: one element at a time through loom/cpp/fp8.h's conversions; the GEMM decodes
//              both operands and sums in f64.
//   fast:      the same conversions over rows in parallel (the transpose in cache tiles);
//              the GEMM decodes each operand once to f32 (every FP8 value is exact in f32)
//              and runs OpenBLAS's sgemm, then applies the scales.
#include "kernels/cpu/fp8.h"

#include <cblas.h>
#include <loom/cpp/fp8.h>
#include <loom/cpp/op_checks/fp8.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::Fp8GemmShape;
using op_checks::Fp8QuantizeShape;
using op_checks::Fp8ScaleShape;

Fp8QuantizeShape check_fp8_quantize(const OpCall* call, bool shapes_only) {
  return op_checks::check_fp8_quantize(call, shapes_only, DeviceType::kCpu);
}
Fp8GemmShape check_fp8_gemm(const OpCall* call, bool shapes_only) {
  return op_checks::check_fp8_gemm(call, shapes_only, DeviceType::kCpu);
}
Fp8ScaleShape check_fp8_scale_update(const OpCall* call, bool shapes_only) {
  return op_checks::check_fp8_scale_update(call, shapes_only, DeviceType::kCpu);
}

uint8_t* bytes_mut(const TensorView& v) { return static_cast<uint8_t*>(v.data); }
const uint8_t* bytes(const TensorView& v) { return static_cast<const uint8_t*>(v.data); }

// max(a, b) where a NaN on either side wins (as "amax").
inline float nan_max(float a, float b) { return a > b || std::isnan(a) ? a : b; }

// ---- fp8_quantize ---------------------------------------------------------------------

Status fp8_quantize_ref(const OpCall* call) {
  return guard([&] {
    Fp8QuantizeShape s = check_fp8_quantize(call, false);
    const TensorView& X = call->inputs[0];
    quantize_elements_ref(
        s.m, s.k, f32(call->inputs[1])[0], s.out_dtype, s.y ? bytes_mut(call->outputs[0]) : nullptr,
        s.yt ? bytes_mut(call->outputs[1]) : nullptr, s.amax ? f32_mut(call->outputs[2]) : nullptr,
        scale_inv_out(call, s.scale_inv),
        [&](int64_t i, int64_t j) { return load(X, i * s.k + j); });
  });
}

// ---- fp8_gemm -------------------------------------------------------------------------

Status fp8_gemm_ref(const OpCall* call) {
  return guard([&] {
    Fp8GemmShape s = check_fp8_gemm(call, false);
    const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
    const double sa = f32(call->inputs[2])[0], sb = f32(call->inputs[3])[0];
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < s.k; ++p)
          acc += static_cast<double>(fp8_to_f32(bytes(A)[i * s.k + p], A.dtype)) *
                 fp8_to_f32(bytes(B)[j * s.k + p], B.dtype);
        double y = s.attrs.alpha * sa * sb * acc;
        // beta == 0 overwrites without reading Y (it may hold NaN).
        if (s.attrs.beta != 0.0f) y += static_cast<double>(s.attrs.beta) * load(Y, i * s.n + j);
        store(Y, i * s.n + j, static_cast<float>(y));
      }
  });
}

Status fp8_gemm_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    Fp8GemmShape s = check_fp8_gemm(call, true);
    *out = io_cost(call, 2.0 * static_cast<double>(s.m) * s.n * s.k);
    if (s.attrs.beta != 0.0f)
      out->bytes_read += static_cast<double>(numel(call->outputs[0])) *
                         static_cast<double>(dtype_size(call->outputs[0].dtype));
  });
}

// ---- fp8_scale_update -----------------------------------------------------------------

// The new scale of one quantiser from its amax (loom/ops.h): kept when amax is 0 or not
// finite, FLT_MAX when fp8_max / amax / 2^margin overflows.
float updated_scale(float amax, float fp8_max, float margin, float old_scale) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return old_scale;
  float scale = fp8_max / amax / std::exp2(margin);
  return std::isinf(scale) ? FLT_MAX : scale;
}

// Registered as cpu.ref and as cpu.fast: it is O(L * Q) scalar work on a few hundred numbers,
// with nothing to make fast.
Status fp8_scale_update_ref(const OpCall* call) {
  return guard([&] {
    Fp8ScaleShape s = check_fp8_scale_update(call, false);
    const float* fp8_max = f32(call->inputs[0]);
    float* history = f32_mut(call->outputs[0]);
    float* scale = f32_mut(call->outputs[1]);
    float* scale_inv = f32_mut(call->outputs[2]);
    const int64_t L = s.history_len, Q = s.quantizers;
    for (int64_t q = 0; q < Q; ++q) {
      float amax = history[s.attrs.current * Q + q];
      if (s.attrs.algo == 0)
        for (int64_t r = 0; r < L; ++r) amax = nan_max(amax, history[r * Q + q]);
      scale[q] = updated_scale(amax, fp8_max[q], s.attrs.margin, scale[q]);
      scale_inv[q] = 1.0f / scale[q];
    }
    if (s.attrs.next >= 0)
      std::fill(history + s.attrs.next * Q, history + (s.attrs.next + 1) * Q, 0.0f);
  });
}

// ---- fast paths ---------------------------------------------------------------------

LOOM_CPU_FAST_BEGIN

Status fp8_quantize_fast(const OpCall* call) {
  return guard([&] {
    Fp8QuantizeShape s = check_fp8_quantize(call, false);
    const TensorView& X = call->inputs[0];
    quantize_rows_fast(
        s.m, s.k, f32(call->inputs[1])[0], s.out_dtype, s.y ? bytes_mut(call->outputs[0]) : nullptr,
        s.yt ? bytes_mut(call->outputs[1]) : nullptr, s.amax ? f32_mut(call->outputs[2]) : nullptr,
        scale_inv_out(call, s.scale_inv),
        [&](int64_t i, float* out) { load_row(X.data, X.dtype, i * s.k, s.k, out); });
  });
}

// An FP8 matrix decoded to f32 through a 256-entry table.
void decode(const TensorView& v, int64_t n, float* out) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = fp8_to_f32(static_cast<uint8_t>(c), v.dtype);
  const uint8_t* in = bytes(v);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = table[in[i]];
}

Status fp8_gemm_fast(const OpCall* call) {
  return guard([&] {
    Fp8GemmShape s = check_fp8_gemm(call, false);
    const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
    if (s.m * s.n == 0) return;
    std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.n * s.k));
    decode(A, s.m * s.k, a.data());
    decode(B, s.n * s.k, b.data());
    const float alpha = s.attrs.alpha * f32(call->inputs[2])[0] * f32(call->inputs[3])[0];
    const float beta = s.attrs.beta;
    std::vector<float> c_copy;
    float* c = Y.dtype == DType::kF32 ? f32_mut(Y) : nullptr;
    if (c == nullptr) {
      c_copy.resize(static_cast<size_t>(s.m * s.n));
      c = c_copy.data();
      if (beta != 0.0f) load_row(Y.data, Y.dtype, 0, s.m * s.n, c);
    }
    // beta == 0 must not read Y (it may hold NaN).
    if (beta == 0.0f) std::memset(c, 0, static_cast<size_t>(s.m * s.n) * sizeof(float));
    if (s.k == 0) {
      if (beta != 0.0f && beta != 1.0f)
        for (int64_t i = 0; i < s.m * s.n; ++i) c[i] *= beta;
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.m),
                  static_cast<int>(s.n), static_cast<int>(s.k), alpha, a.data(),
                  static_cast<int>(s.k), b.data(), static_cast<int>(s.k), beta, c,
                  static_cast<int>(s.n));
    }
    if (!c_copy.empty()) store_row(Y.data, Y.dtype, 0, s.m * s.n, c);
  });
}

LOOM_CPU_FAST_END

// ---- registration ---------------------------------------------------------------------

LOOM_CPU_HOOKS(fp8_quantize, check_fp8_quantize, 2)

bool fp8_gemm_supports(const OpCall* call) {
  return passes([&] { check_fp8_gemm(call, true); });
}
bool fp8_gemm_fast_supports(const OpCall* call) {
  // BLAS takes int dimensions.
  return cpu_has_avx2() && passes([&] {
           Fp8GemmShape s = check_fp8_gemm(call, true);
           if (s.m > INT32_MAX || s.n > INT32_MAX || s.k > INT32_MAX) throw 0;
         });
}

bool fp8_scale_update_supports(const OpCall* call) {
  return passes([&] { check_fp8_scale_update(call, true); });
}
Status fp8_scale_update_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    Fp8ScaleShape s = check_fp8_scale_update(call, true);
    *out = io_cost(call, 4.0 * static_cast<double>(s.history_len * s.quantizers));
  });
}

}  // namespace

Fp8Outs fp8_outs(const OpCall* call, const op_checks::Fp8QuantizeShape& s) {
  return {s.y ? bytes_mut(call->outputs[0]) : nullptr, s.yt ? bytes_mut(call->outputs[1]) : nullptr,
          s.amax ? f32_mut(call->outputs[2]) : nullptr, scale_inv_out(call, s.scale_inv)};
}

float rounded_to(DType t, float v) {
  uint32_t slot = 0;
  store(&slot, t, 0, v);
  return load(&slot, t, 0);
}

void round_row(DType t, float* v, int64_t n, std::vector<uint16_t>& scratch) {
  if (t == DType::kF32) return;
  scratch.resize(static_cast<size_t>(n));
  store_row(scratch.data(), t, 0, n, v);
  load_row(scratch.data(), t, 0, n, v);
}

float* scale_inv_out(const OpCall* call, bool present) {
  return present ? f32_mut(call->outputs[3]) : nullptr;
}

void quantize_elements_ref(int64_t m, int64_t k, float scale, DType out_dtype, uint8_t* y,
                           uint8_t* yt, float* amax, float* scale_inv,
                           const std::function<float(int64_t, int64_t)>& value) {
  if (scale_inv != nullptr) scale_inv[0] = 1.0f / scale;  // as fp8_scale_update writes it
  float folded = amax != nullptr ? amax[0] : 0.0f;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const float x = value(i, j);
      const uint8_t q = f32_to_fp8(x * scale, out_dtype);
      if (y != nullptr) y[i * k + j] = q;
      if (yt != nullptr) yt[j * m + i] = q;
      folded = nan_max(folded, std::fabs(x));
    }
  if (amax != nullptr && m * k > 0) amax[0] = folded;
}

void quantize_rows_fast(int64_t m, int64_t k, float scale, DType out_dtype, uint8_t* y, uint8_t* yt,
                        float* amax, float* scale_inv,
                        const std::function<void(int64_t, float*)>& row_of) {
  if (scale_inv != nullptr) scale_inv[0] = 1.0f / scale;  // as fp8_scale_update writes it
  if (m * k == 0) return;
  // Tiles of kTile rows: each converts its rows once, writes Y's rows and Yt's columns.
  constexpr int64_t kTile = 32;
  uint32_t bits = 0;  // amax as the bits of |x| (see "amax" in elementwise.cc)
#pragma omp parallel reduction(max : bits)
  {
    std::vector<float> row(static_cast<size_t>(k));
    std::vector<uint8_t> tile(static_cast<size_t>(kTile * k));
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < m; i0 += kTile) {
      const int64_t rows = std::min(kTile, m - i0);
      for (int64_t r = 0; r < rows; ++r) {
        row_of(i0 + r, row.data());
        uint8_t* out = tile.data() + r * k;
        for (int64_t j = 0; j < k; ++j) {
          uint32_t b;
          std::memcpy(&b, &row[j], sizeof(b));
          bits = std::max(bits, b & 0x7fffffffu);
          out[j] = f32_to_fp8(row[j] * scale, out_dtype);
        }
        if (y != nullptr) std::memcpy(y + (i0 + r) * k, out, static_cast<size_t>(k));
      }
      if (yt != nullptr)
        for (int64_t j = 0; j < k; ++j)
          for (int64_t r = 0; r < rows; ++r) yt[j * m + i0 + r] = tile[r * k + j];
    }
  }
  if (amax != nullptr) {
    float folded;
    std::memcpy(&folded, &bits, sizeof(folded));
    amax[0] = nan_max(amax[0], folded);
  }
}

void add_fp8_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kFp8Quantize, fp8_quantize);
  add_kernels(out, ops::kFp8Gemm, kRefName, kRefPriority, fp8_gemm_ref, fp8_gemm_supports,
              fp8_gemm_cost, {DType::kF8E4M3, DType::kF8E5M2});
  add_kernels(out, ops::kFp8Gemm, kFastName, kFastPriority, fp8_gemm_fast, fp8_gemm_fast_supports,
              fp8_gemm_cost, {DType::kF8E4M3, DType::kF8E5M2});
  for (auto [name, priority] : {std::pair{kRefName, kRefPriority}, {kFastName, kFastPriority}})
    add_kernels(out, ops::kFp8ScaleUpdate, name, priority, fp8_scale_update_ref,
                fp8_scale_update_supports, fp8_scale_update_cost, {DType::kF32});
}

}  // namespace loom::kernels::cpu
