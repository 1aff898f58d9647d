#include "kernels/cpu/common.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu {

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

LOOM_CPU_FAST_BEGIN

void load_row(const void* data, DType t, int64_t i, int64_t n, float* out) {
  int64_t k = 0;
  if (t == DType::kF32) {
    const float* p = static_cast<const float*>(data) + i;
    for (; k < n; ++k) out[k] = p[k];
  } else if (t == DType::kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(data) + i;
    for (; k + 8 <= n; k += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k));
      __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
      _mm256_storeu_ps(out + k, _mm256_castsi256_ps(w));
    }
    for (; k < n; ++k) out[k] = bf16_to_f32(p[k]);
  } else if (t == DType::kF16) {
    const uint16_t* p = static_cast<const uint16_t*>(data) + i;
    for (; k + 8 <= n; k += 8)
      _mm256_storeu_ps(out + k,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k))));
    for (; k < n; ++k) out[k] = f16_to_f32(p[k]);
  }
}

void store_row(void* data, DType t, int64_t i, int64_t n, const float* in) {
  int64_t k = 0;
  if (t == DType::kF32) {
    float* p = static_cast<float*>(data) + i;
    for (; k < n; ++k) p[k] = in[k];
  } else if (t == DType::kBF16) {
    // Round to nearest even as f32_to_bf16 does; NaNs take the scalar path (quiet bit set).
    uint16_t* p = static_cast<uint16_t*>(data) + i;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    for (; k + 8 <= n; k += 8) {
      __m256 x = _mm256_loadu_ps(in + k);
      if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
        for (int j = 0; j < 8; ++j) p[k + j] = f32_to_bf16(in[k + j]);
        continue;
      }
      __m256i b = _mm256_castps_si256(x);
      __m256i r = _mm256_add_epi32(
          b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), one)));
      r = _mm256_srli_epi32(r, 16);
      // Pack 8 x u32 (< 2^16) into 8 x u16: packus works per 128-bit lane.
      __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + k), _mm_packus_epi32(lo, hi));
    }
    for (; k < n; ++k) p[k] = f32_to_bf16(in[k]);
  } else if (t == DType::kF16) {
    uint16_t* p = static_cast<uint16_t*>(data) + i;
    for (; k + 8 <= n; k += 8) {
      __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + k), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + k), h);
    }
    for (; k < n; ++k) p[k] = f32_to_f16(in[k]);
  }
}

F32Copy::F32Copy(const TensorView& v) {
  const bool packed = is_contiguous(v);
  if (v.dtype == DType::kF32 && packed) {
    ptr_ = static_cast<const float*>(v.data);
    return;
  }
  int64_t n = numel(v);
  copy_.resize(static_cast<size_t>(n));
  ptr_ = copy_.data();
  if (!packed) {  // rows strided, each packed (OpArgs::float_rows_in): gather row by row
    const int64_t cols = v.ndim > 0 ? v.shape[v.ndim - 1] : 1;
    const int64_t rows = cols > 0 ? n / cols : 0;
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t offset = 0, rest = r;
      for (int32_t d = v.ndim - 2; d >= 0; --d) {
        offset += (rest % v.shape[d]) * v.strides[d];
        rest /= v.shape[d];
      }
      load_row(v.data, v.dtype, offset, cols, copy_.data() + r * cols);
    }
    return;
  }
  constexpr int64_t kChunk = 4096;
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t c = 0; c < n; c += kChunk)
    load_row(v.data, v.dtype, c, std::min(kChunk, n - c), copy_.data() + c);
}

LOOM_CPU_FAST_END

int64_t max_numel(const OpCall* call) {
  int64_t n = 0;
  for (int32_t i = 0; i < call->num_inputs; ++i) n = std::max(n, numel(call->inputs[i]));
  for (int32_t i = 0; i < call->num_outputs; ++i) n = std::max(n, numel(call->outputs[i]));
  return n;
}

void add_kernels(std::vector<KernelDesc>& out, const char* op, const char* name, int32_t priority,
                 KernelFn fn, KernelSupportsFn supports, KernelCostFn cost,
                 std::initializer_list<DType> dtypes) {
  append_kernel_descs(out, op, DeviceType::kCpu, dtypes, name, priority, fn, supports, cost);
}

}  // namespace loom::kernels::cpu

namespace loom::kernels::cpu {

void run_library_op(const char* op, DType key, bool fast, std::initializer_list<TensorView> inputs,
                    std::initializer_list<TensorView> outputs, const void* attrs,
                    uint64_t attrs_size) {
  std::vector<TensorView> in(inputs), out(outputs);
  OpCall c{sizeof(OpCall),
           in.data(),
           static_cast<int32_t>(in.size()),
           out.data(),
           static_cast<int32_t>(out.size()),
           attrs,
           attrs_size,
           nullptr,
           nullptr,
           0};
  // The fast kernel where asked for, the library has it and it takes the call (AVX2).
  const KernelDesc* k = fast ? cpu::find_kernel(op, key, kFastName) : nullptr;
  if (k != nullptr && k->supports != nullptr && !k->supports(&c)) k = nullptr;
  if (k == nullptr) k = cpu::find_kernel(op, key, kRefName);
  if (k == nullptr)
    throw Error(Code::kInternal, std::string("cpu kernels: no kernel in this library for ") + op);
  throw_if_error(k->fn(&c));
}

}  // namespace loom::kernels::cpu
