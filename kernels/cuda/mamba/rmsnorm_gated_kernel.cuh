// Device code of rmsnorm_gated / rmsnorm_gated_bwd (loom/ops/mamba.h), apart from the
// launchers (rmsnorm_gated.cu) so that tests/kernels/cuda/mamba_emulation can run it on the
// CPU. T is the storage type, f32 arithmetic.
//
// Per norm group (a row's run of group_size channels), g = y * silu(z), r = rstd:
//   forward   out = g * r * w,  r = 1 / sqrt(mean(g^2) + eps)
//   backward  dg = r * (dout * w - g * r^2 * mean(dout * w * g)),
//             dy = dg * silu(z),  dz = dg * y * silu'(z),  dweight += sum_rows dout * g * r
// One warp per (row, group), the grid striding over them (lanes on consecutive channels);
// the group's sums are warp sums. dweight is a second kernel: one thread per (channel, slice
// of rows), lanes on consecutive channels, the block's 8 slices summed through shared memory
// and one atomicAdd per channel and block.
#pragma once

#include <stdint.h>

#include "kernels/cuda/common/dtype.cuh"

namespace loom::kernels::cuda::mamba {

inline constexpr int kGatedThreads = 256;  // 8 warps

struct GatedArgs {
  const void* dout;  // (N, C), backward
  const void* y;     // (N, C)
  const void* z;     // (N, C)
  const void* w;     // (C)
  float* rstd;       // (N, C / gs): written forward, read backward
  void* out;         // (N, C): out forward, dy backward
  void* dz;          // (N, C), backward
  float* dw;         // (C) +=, backward
  int64_t n, c, gs;
  float eps;
};

__device__ __forceinline__ float gated_warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float gated_silu(float z) { return z / (1.0f + expf(-z)); }

template <class T>
__global__ void __launch_bounds__(kGatedThreads) rmsnorm_gated_fwd_kernel(GatedArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t groups = a.c / a.gs, items = a.n * groups;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const T *y = static_cast<const T*>(a.y), *z = static_cast<const T*>(a.z);
  const T* w = static_cast<const T*>(a.w);
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       item < items; item += warps) {
    const int64_t row = item / groups, c0 = (item % groups) * a.gs, base = row * a.c + c0;
    float ss = 0.0f;
    for (int64_t k = lane; k < a.gs; k += 32) {
      const float g = to_f32<T>(y[base + k]) * gated_silu(to_f32<T>(z[base + k]));
      ss += g * g;
    }
    ss = gated_warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(a.gs) + a.eps);
    for (int64_t k = lane; k < a.gs; k += 32) {
      const float g = to_f32<T>(y[base + k]) * gated_silu(to_f32<T>(z[base + k]));
      static_cast<T*>(a.out)[base + k] = from_f32<T>(g * r * to_f32<T>(w[c0 + k]));
    }
    if (lane == 0) a.rstd[item] = r;
  }
}

template <class T>
__global__ void __launch_bounds__(kGatedThreads) rmsnorm_gated_bwd_kernel(GatedArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t groups = a.c / a.gs, items = a.n * groups;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const T *dout = static_cast<const T*>(a.dout), *y = static_cast<const T*>(a.y);
  const T *z = static_cast<const T*>(a.z), *w = static_cast<const T*>(a.w);
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       item < items; item += warps) {
    const int64_t row = item / groups, c0 = (item % groups) * a.gs, base = row * a.c + c0;
    float dot = 0.0f;  // sum dout * w * g
    for (int64_t k = lane; k < a.gs; k += 32) {
      const float g = to_f32<T>(y[base + k]) * gated_silu(to_f32<T>(z[base + k]));
      dot += to_f32<T>(dout[base + k]) * to_f32<T>(w[c0 + k]) * g;
    }
    dot = gated_warp_sum(dot);
    const float r = a.rstd[item];
    const float m = dot / static_cast<float>(a.gs) * r * r;
    for (int64_t k = lane; k < a.gs; k += 32) {
      const float yv = to_f32<T>(y[base + k]), zv = to_f32<T>(z[base + k]);
      const float sg = 1.0f / (1.0f + expf(-zv)), silu = zv * sg;
      const float g = yv * silu;
      const float dg = r * (to_f32<T>(dout[base + k]) * to_f32<T>(w[c0 + k]) - g * m);
      static_cast<T*>(a.out)[base + k] = from_f32<T>(dg * silu);
      static_cast<T*>(a.dz)[base + k] = from_f32<T>(dg * yv * sg * (1.0f + zv * (1.0f - sg)));
    }
  }
}

// dweight[c] += sum_n dout[n, c] * g[n, c] * rstd[n, c / gs]. Grid (ceil(C / 32), slices),
// kGatedThreads threads: lane -> channel, warp -> rows warp, warp + 8, ... of the block's
// slice. Dynamic shared memory kGatedThreads floats.
template <class T>
__global__ void __launch_bounds__(kGatedThreads) rmsnorm_gated_wgrad_kernel(GatedArgs a) {
  extern __shared__ float mamba_smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t groups = a.c / a.gs;
  const T *dout = static_cast<const T*>(a.dout), *y = static_cast<const T*>(a.y);
  const T* z = static_cast<const T*>(a.z);
  float acc = 0.0f;
  if (c < a.c)
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * warps + warp; row < a.n;
         row += static_cast<int64_t>(gridDim.y) * warps) {
      const int64_t i = row * a.c + c;
      const float g = to_f32<T>(y[i]) * gated_silu(to_f32<T>(z[i]));
      acc += to_f32<T>(dout[i]) * g * a.rstd[row * groups + c / a.gs];
    }
  mamba_smem[threadIdx.x] = acc;
  __syncthreads();
  if (warp == 0 && c < a.c) {
    float sum = 0.0f;
    for (int k = 0; k < warps; ++k) sum += mamba_smem[k * 32 + lane];
    atomicAdd(a.dw + c, sum);
  }
}

}  // namespace loom::kernels::cuda::mamba
