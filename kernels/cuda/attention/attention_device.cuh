// Device helpers of the attention kernels: the tensor-core primitives (cp.async, ldmatrix,
// mma.sync m16n8k16 with f32 accumulation) as inline PTX, element access for the generic
// kernels, the mask of loom/ops.h and the Philox dropout decision.
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"),
// with lane = 4 * gid + tig (gid = lane / 4 in [0, 8), tig = lane % 4):
//   A (16 x 16, row-major), 4 registers of 2 elements: a0 = (gid, 2 tig + {0, 1}),
//     a1 = (gid + 8, 2 tig + {0, 1}), a2 = (gid, 8 + 2 tig + {0, 1}), a3 = (gid + 8, 8 + ...)
//   B (16 x 8, "col": element (k, n)), 2 registers: b0 = (k = 2 tig + {0, 1}, n = gid),
//     b1 = (k = 8 + 2 tig + {0, 1}, n = gid)
//   C (16 x 8 f32), 4 floats: c0, c1 = (gid, 2 tig + {0, 1}), c2, c3 = (gid + 8, 2 tig + ...)
// The lower 16 bits of a register hold the element of the lower column (k). ldmatrix.x4
// loads four 8 x 8 b16 matrices, matrix i from the row addresses of lanes 8 i .. 8 i + 7;
// register i of a lane holds row lane / 4, elements 2 (lane % 4) + {0, 1} of matrix i
// (with .trans: of the transposed matrix). The C layout of two adjacent n8 tiles equals
// the A layout of one k16 step, so scores become the next product's A operand in registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <loom/cpp/philox.h>
#include <loom/types.h>
#include <stdint.h>

#include "kernels/cuda/attention/attention_mma.cuh"
#include "kernels/cuda/attention/attention_params.cuh"
#include "kernels/cuda/common/dtype.cuh"

namespace loom::kernels::cuda::attn {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Two floats rounded to T and packed, `lo` in the lower 16 bits.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Copies rows [row0, row0 + kRows) of a (rows, D) strided 16-bit tensor into a shared tile
// with rows of D + 8 elements (padded by 16 bytes against bank conflicts), zero-filling the
// rows at or beyond `rows`. `base` points at row 0, rows are `stride` elements apart; every
// row must be 16-byte aligned. Asynchronous: the caller commits and waits (cp.async).
// A thread keeps its 16-byte column and steps one running offset down the rows: offsets
// recomputed per pass were hoisted out of the backward's loop, one set per tile stride
// (Q's and dO's differ for strided views), and spilled at D = 128.
template <class T, int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile_async(T* tile, const T* base, int64_t row0, int64_t rows,
                                                int64_t stride) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  static_assert(kThreads % kChunks == 0, "a thread keeps its column");
  constexpr int kStep = kThreads / kChunks;  // rows per pass of the block
  const int c = threadIdx.x % kChunks;
  const int64_t step = kStep * stride;
  int64_t off = (row0 + threadIdx.x / kChunks) * stride + c * 8;  // of row row0 + r
  for (int r = threadIdx.x / kChunks; r < kRows; r += kStep, off += step) {
    const bool valid = row0 + r < rows;
    cp_async_16(tile + r * (D + 8) + c * 8, valid ? base + off : base, valid);
  }
}

// ---- Element access of the generic kernels ----------------------------------------------

// All tensors of storage type T: the dtype arguments are ignored.
template <class T>
struct TypedIo {
  __device__ __forceinline__ static float load(const void* p, DType, int64_t i) {
    return to_f32<T>(static_cast<const T*>(p)[i]);
  }
  __device__ __forceinline__ static void store(void* p, DType, int64_t i, float x) {
    static_cast<T*>(p)[i] = from_f32<T>(x);
  }
};

// Tensors of differing float dtypes (the checks allow it): a switch per element.
struct AnyIo {
  __device__ __forceinline__ static float load(const void* p, DType dt, int64_t i) {
    if (dt == DType::kBF16) return to_f32(static_cast<const __nv_bfloat16*>(p)[i]);
    if (dt == DType::kF16) return to_f32(static_cast<const __half*>(p)[i]);
    return static_cast<const float*>(p)[i];
  }
  __device__ __forceinline__ static void store(void* p, DType dt, int64_t i, float x) {
    if (dt == DType::kBF16)
      static_cast<__nv_bfloat16*>(p)[i] = from_f32<__nv_bfloat16>(x);
    else if (dt == DType::kF16)
      static_cast<__half*>(p)[i] = from_f32<__half>(x);
    else
      static_cast<float*>(p)[i] = x;
  }
};

// ---- Mask and dropout -------------------------------------------------------------------

// loom/ops.h: key s is hidden from query t when causal and s > t + (S - T), or when their
// segment ids differ (compared by the caller, which has them at hand).
__device__ __forceinline__ bool causal_hidden(bool causal, int64_t t, int64_t s, int64_t T,
                                              int64_t S) {
  return causal && s > t + (S - T);
}

// Word w (0..3) of a Philox block without indexing the array at run time (which would put
// it in local memory).
__device__ __forceinline__ uint32_t philox_word(const Philox4& r, uint32_t w) {
  uint32_t lo = (w & 1u) ? r.w[1] : r.w[0];
  uint32_t hi = (w & 1u) ? r.w[3] : r.w[2];
  return (w & 2u) ? hi : lo;
}

// The multiplier of element `index` of the (B, H, T, S) probabilities: keep / (1 - p).
// The Philox element index of probability (b, h, t, s) (loom/ops.h; a block's place in its
// whole with AttentionBlockAttrs).
__device__ __forceinline__ uint64_t dropout_index(const AttentionParams& p, int64_t b, int64_t h,
                                                  int64_t t, int64_t s) {
  return static_cast<uint64_t>(((b * p.h + h) * p.q_total + p.q_offset + t) * p.k_total +
                               p.k_offset + s);
}

__device__ __forceinline__ float dropout_mult(uint64_t key, uint64_t counter, uint64_t index,
                                              uint32_t threshold, float keep_scale) {
  Philox4 r = philox4x32_10(key, counter + index / 4);
  return (philox_word(r, static_cast<uint32_t>(index % 4)) >> 8) >= threshold ? keep_scale : 0.0f;
}

// Multipliers of elements index and index + 1 (one Philox block when both fall in it).
__device__ __forceinline__ void dropout_mult2(uint64_t key, uint64_t counter, uint64_t index,
                                              uint32_t threshold, float keep_scale, float& m0,
                                              float& m1) {
  Philox4 r = philox4x32_10(key, counter + index / 4);
  uint32_t w = static_cast<uint32_t>(index % 4);
  m0 = (philox_word(r, w) >> 8) >= threshold ? keep_scale : 0.0f;
  if (w == 3u) r = philox4x32_10(key, counter + (index + 1) / 4);
  m1 = (philox_word(r, (w + 1u) & 3u) >> 8) >= threshold ? keep_scale : 0.0f;
}

// ---- Warp reductions --------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Over the 4 lanes of a quad (the lanes that share a row of an mma C fragment).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

}  // namespace loom::kernels::cuda::attn
