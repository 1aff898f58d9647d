// Device-side helpers of the pointwise kernels: element access in any float dtype, chosen at
// run time, 4 elements at a time; warp reductions; launch sizes.
//
// Why the dtype is a kernel argument and not a template parameter: every tensor of these
// ops may have its own float dtype (a bf16 X with an f32 weight, an f32 table with a bf16
// Y), as on the CPU. Templating on each tensor's type would multiply instantiations; a
// switch on a dtype that is uniform across the grid costs a few instructions per 4 elements,
// which memory-bound kernels do not notice.
//
// Chunks: work is done on 4 consecutive elements. When the chunk lies in bounds and its
// address is aligned to 4 elements (`vec`, decided on the host from the base pointer and,
// for rows, a row width that is a multiple of 4), it is moved with one 16-byte (f32) or
// 8-byte (bf16, f16) access; otherwise element by element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <loom/kernel.h>
#include <stdint.h>

#include <algorithm>
#include <initializer_list>

#include "kernels/cuda/common/dtype.cuh"

namespace loom::kernels::cuda::pointwise {

// Threads per block of the flat (elementwise) kernels.
inline constexpr int kFlatThreads = 256;
// Upper bound on the blocks of a grid-stride launch: enough to fill any current GPU many
// times over; larger tensors loop.
inline constexpr int64_t kMaxGridBlocks = int64_t{1} << 16;

// Blocks of `threads` threads that give each thread about one of `items` work items,
// between 1 and kMaxGridBlocks (the kernels loop over the rest).
inline unsigned grid_for(int64_t items, int threads) {
  int64_t b = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, kMaxGridBlocks));
}

// True when `v`'s data may be accessed 4 elements at a time (address aligned to 4
// elements). An absent tensor (null data) does not constrain.
inline bool aligned4(const TensorView& v) {
  return reinterpret_cast<uintptr_t>(v.data) % (4 * dtype_size(v.dtype)) == 0;
}

// ---- Raw copies (the head layout ops move whole rows of D elements unchanged) -----------

// The unsigned type of a `bytes`-byte access.
template <int kBytes>
struct Unit;
template <>
struct Unit<16> {
  using type = uint4;
};
template <>
struct Unit<8> {
  using type = uint2;
};
template <>
struct Unit<4> {
  using type = uint32_t;
};
template <>
struct Unit<2> {
  using type = uint16_t;
};

// The widest access (16, 8, 4 or 2 bytes) that divides `row_bytes` and every address in
// `ptrs`, so that rows of `row_bytes` bytes copy in whole units.
inline int copy_unit(int64_t row_bytes, std::initializer_list<const void*> ptrs) {
  for (int unit : {16, 8, 4}) {
    bool ok = row_bytes % unit == 0;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % unit == 0;
    if (ok) return unit;
  }
  return 2;
}

// Runs the statements that follow with `U` the unsigned type of a `unit`-byte access.
#define LOOM_POINTWISE_UNIT_SWITCH(unit, U, ...)                    \
  do {                                                              \
    switch (unit) {                                                 \
      case 16: {                                                    \
        using U = ::loom::kernels::cuda::pointwise::Unit<16>::type; \
        __VA_ARGS__;                                                \
      } break;                                                      \
      case 8: {                                                     \
        using U = ::loom::kernels::cuda::pointwise::Unit<8>::type;  \
        __VA_ARGS__;                                                \
      } break;                                                      \
      case 4: {                                                     \
        using U = ::loom::kernels::cuda::pointwise::Unit<4>::type;  \
        __VA_ARGS__;                                                \
      } break;                                                      \
      default: {                                                    \
        using U = ::loom::kernels::cuda::pointwise::Unit<2>::type;  \
        __VA_ARGS__;                                                \
      } break;                                                      \
    }                                                               \
  } while (0)

// ---- Element access in a run-time float dtype ------------------------------------------

__device__ __forceinline__ float load_elem(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return __half2float(static_cast<const __half*>(p)[i]);
  }
}

__device__ __forceinline__ void store_elem(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
  }
}

// v[e] = element i + e for e < 4; elements at or past `end` read as 0. With `vec` (the
// tensor's base is aligned to 4 elements and i is a multiple of 4) a full chunk is one access.
__device__ __forceinline__ void load4(const void* p, DType t, int64_t i, int64_t end, bool vec,
                                      float v[4]) {
  if (vec && i + 4 <= end) {
    switch (t) {
      case DType::kF32: {
        float4 q = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        return;
      }
      case DType::kBF16: {
        uint2 q = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p) + i);
        float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
        float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
        return;
      }
      default: {
        uint2 q = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p) + i);
        float2 a = __half22float2(*reinterpret_cast<const __half2*>(&q.x));
        float2 b = __half22float2(*reinterpret_cast<const __half2*>(&q.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
        return;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = i + e < end ? load_elem(p, t, i + e) : 0.0f;
}

// Stores v[e] to element i + e for the e < 4 with i + e < `end` (rounding to nearest even).
__device__ __forceinline__ void store4(void* p, DType t, int64_t i, int64_t end, bool vec,
                                       const float v[4]) {
  if (vec && i + 4 <= end) {
    switch (t) {
      case DType::kF32:
        *reinterpret_cast<float4*>(static_cast<float*>(p) + i) =
            make_float4(v[0], v[1], v[2], v[3]);
        return;
      case DType::kBF16: {
        __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
        uint2 q;
        q.x = *reinterpret_cast<const uint32_t*>(&a);
        q.y = *reinterpret_cast<const uint32_t*>(&b);
        *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i) = q;
        return;
      }
      default: {
        __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
        uint2 q;
        q.x = *reinterpret_cast<const uint32_t*>(&a);
        q.y = *reinterpret_cast<const uint32_t*>(&b);
        *reinterpret_cast<uint2*>(static_cast<__half*>(p) + i) = q;
        return;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (i + e < end) store_elem(p, t, i + e, v[e]);
}

// ---- Warp reductions (every lane of the warp must take part) --------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace loom::kernels::cuda::pointwise
