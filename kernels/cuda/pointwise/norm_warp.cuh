// The forward of layernorm / rmsnorm for the common transformer case, one warp per row:
// X, weight, bias and Y all bf16 (or all f16), rows of C <= 2048 elements with C a multiple
// of 8, every tensor 16-byte aligned. norm.cuh's launcher takes this kernel then and its
// general kernel (any dtype mix, any width, any alignment) otherwise.
//
// Why a second kernel: the general one switches on each tensor's dtype at run time and keeps
// up to 8 chunks of 4 per lane for rows of up to 16K elements; that costs ~100 registers, so
// an H200 SM holds 16 of its warps, one row each, which is too few loads in flight to keep
// HBM busy (GPT-2's layernorm ran at ~0.8 TB/s, a sixth of the H200's bandwidth, in the
// 2026-11-27 profile). Here the storage type is a template parameter and a lane keeps
// exactly kVecs vectors of 8 elements (16-byte loads and stores): C = 768 is 3 vectors a
// lane, C = 2048 is 8.
//
// The arithmetic is the general kernel's: f32 statistics in two passes over the registers
// (mean, then the mean of squared deviations; RMSNorm: the mean of squares),
// rstd = 1 / sqrtf(var + eps), Y = (x - mean) * rstd * (w + gamma_shift) + b, rounded to T
// once. Only the order of the partial sums differs (a lane's columns, then the warp's
// butterfly).
//
// Plain CUDA C++ without host-only code, so that tests/kernels/cuda/norm_emulation runs it
// on the CPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace loom::kernels::cuda::pointwise {

// Rows (warps) per block of the warp-per-row kernels, and the widest row they take.
inline constexpr int kWarpRowsPerBlock = 8;
inline constexpr int kWarpRowMaxVecs = 8;  // 8 vectors of 8 elements per lane: C <= 2048

template <class T>
struct NormFwdWarpArgs {
  const T* x;    // (N, C)
  const T* w;    // (C)
  const T* b;    // (C) or null (always null for RMSNorm)
  T* y;          // (N, C)
  float* mean;   // (N); null for RMSNorm
  float* rstd;   // (N)
  int64_t rows;  // N
  int64_t cols;  // C, a multiple of 8, at most 256 * kVecs
  float eps, gamma_shift;
};

// 8 elements of T at p (16-byte aligned) as floats, and back (round to nearest even).
template <class T>
__device__ __forceinline__ void load8(const T* p, float v[8]) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f;
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    else
      f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

template <class T>
__device__ __forceinline__ void store8(T* p, const float v[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Sum over the 32 lanes of a warp; every lane gets the total (the same bits).
__device__ __forceinline__ float norm_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Blocks of kWarpRowsPerBlock warps; warp r of block b takes rows b * kWarpRowsPerBlock + r,
// then strides by the grid. Lane l holds vectors l, l + 32, ..., l + 32 (kVecs - 1) of its
// row (those below C / 8). A warp's row is uniform across its lanes, so the shuffles are.
template <class T, bool kRms, int kVecs>
__global__ void __launch_bounds__(kWarpRowsPerBlock * 32)
    norm_fwd_warp_kernel(NormFwdWarpArgs<T> a) {
  const int lane = threadIdx.x % 32;
  const int64_t vecs = a.cols / 8;
  const float inv_c = 1.0f / static_cast<float>(a.cols);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
       row < a.rows; row += static_cast<int64_t>(gridDim.x) * kWarpRowsPerBlock) {
    const T* x = a.x + row * a.cols;
    float v[kVecs][8];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = static_cast<int64_t>(k) * 32 + lane;
      if (j < vecs) {
        load8(x + j * 8, v[k]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[k][e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += kRms ? v[k][e] * v[k][e] : v[k][e];
    }
    sum = norm_warp_sum(sum);
    float mean = 0.0f, var;
    if (kRms) {
      var = sum * inv_c;  // the mean of squares
    } else {
      mean = sum * inv_c;
      float sq = 0.0f;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (static_cast<int64_t>(k) * 32 + lane >= vecs) continue;  // zeros there, not -mean
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = v[k][e] - mean;
          sq += d * d;
        }
      }
      var = norm_warp_sum(sq) * inv_c;
    }
    const float rstd = 1.0f / sqrtf(var + a.eps);
    T* y = a.y + row * a.cols;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = static_cast<int64_t>(k) * 32 + lane;
      if (j >= vecs) continue;
      float w[8], b[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      load8(a.w + j * 8, w);
      if (!kRms && a.b != nullptr) load8(a.b + j * 8, b);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k][e] = (v[k][e] - mean) * rstd * (w[e] + a.gamma_shift) + b[e];
      store8(y + j * 8, v[k]);
    }
    if (lane == 0) {
      if (!kRms) a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  }
}

}  // namespace loom::kernels::cuda::pointwise
