// Device code of causal_conv1d / causal_conv1d_bwd (loom/ops/mamba.h), kept apart from the
// launchers (causal_conv1d.cu) so that tests/kernels/cuda/mamba_emulation can run it on the
// CPU. T is the storage type (float, __nv_bfloat16, __half), f32 arithmetic; kW = W in [1, 8]
// is a template parameter so that the weights and the sliding windows stay in registers.
//
// Forward: one thread per output (b, t, c), the grid striding over B * T * Cc (threads of a
// warp on consecutive channels: every load coalesced). final_state: one thread per element.
//
// Backward: one thread per (b, c) and a tile of kConvTile steps, sliding along t. Step t
// recomputes u[t] from a window of the last kW inputs, du[t] = dy[t] * silu'(u[t]) (dy[t]
// without the activation), and keeps a window of the last kW du; once du[t] is known,
//   dx[s] = sum_j w[j] * du[s + W - 1 - j],  s = t - (W - 1)
// is complete. The tile's steps add du[t] * xe[t + j - (W - 1)] to dweight[j] and du[t] to
// dbias in registers; the 8 tiles of a block (its warps) combine through shared memory and
// one atomicAdd per (channel, j) goes to the f32 outputs.
#pragma once

#include <stdint.h>

#include "kernels/cuda/common/dtype.cuh"

namespace loom::kernels::cuda::mamba {

inline constexpr int kConvThreads = 256;  // 8 warps
inline constexpr int kConvTile = 32;      // steps per thread in the backward

struct ConvArgs {
  const void* x;     // (B, T, Cc)
  const void* w;     // (Cc, W)
  const void* bias;  // (Cc) or null
  const void* init;  // (B, W - 1, Cc) or null
  const void* dy;    // (B, T, Cc), backward
  void* y;           // (B, T, Cc): y forward, dx backward
  void* fin;         // (B, W - 1, Cc) or null, forward
  float* dw;         // (Cc, W) +=, backward
  float* db;         // (Cc) += or null, backward
  int64_t b, t, c;
  int act;
};

// xe[b, s, c]: x for s >= 0, the initial state (or zero) for s < 0 (s >= -(W - 1)).
template <class T, int kW>
__device__ __forceinline__ float conv_xe(const ConvArgs& a, int64_t b, int64_t s, int64_t c) {
  if (s >= 0) return to_f32<T>(static_cast<const T*>(a.x)[(b * a.t + s) * a.c + c]);
  if (a.init == nullptr) return 0.0f;
  return to_f32<T>(static_cast<const T*>(a.init)[(b * (kW - 1) + (kW - 1) + s) * a.c + c]);
}

__device__ __forceinline__ float conv_sigmoid(float u) { return 1.0f / (1.0f + expf(-u)); }

template <class T, int kW>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_fwd_kernel(ConvArgs a) {
  const int64_t total = a.b * a.t * a.c;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % a.c, t = (i / a.c) % a.t, b = i / (a.c * a.t);
    const T* w = static_cast<const T*>(a.w) + c * kW;
    float u = a.bias != nullptr ? to_f32<T>(static_cast<const T*>(a.bias)[c]) : 0.0f;
#pragma unroll
    for (int j = 0; j < kW; ++j) u += to_f32<T>(w[j]) * conv_xe<T, kW>(a, b, t + j - (kW - 1), c);
    if (a.act) u = u * conv_sigmoid(u);
    static_cast<T*>(a.y)[i] = from_f32<T>(u);
  }
}

// final_state[b, k, c] = row T - (W - 1) + k of [initial_state (or zeros), x].
template <class T, int kW>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_state_kernel(ConvArgs a) {
  constexpr int kRows = kW > 1 ? kW - 1 : 1;  // launched only for W > 1
  const int64_t total = a.b * kRows * a.c;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % a.c, k = (i / a.c) % kRows, b = i / (a.c * kRows);
    static_cast<T*>(a.fin)[i] = from_f32<T>(conv_xe<T, kW>(a, b, a.t - kRows + k, c));
  }
}

// Grid (ceil(Cc / 32), ceil(T / (8 * kConvTile)), B), kConvThreads threads; dynamic shared
// memory 8 * (kW + 1) * 32 floats.
template <class T, int kW>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_bwd_kernel(ConvArgs a) {
  extern __shared__ float mamba_smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t b = blockIdx.z;
  const int64_t t0 = (static_cast<int64_t>(blockIdx.y) * (kConvThreads / 32) + warp) * kConvTile;
  const bool active = c < a.c && t0 < a.t;
  float w[kW], dw[kW], db = 0.0f;
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    w[j] = active ? to_f32<T>(static_cast<const T*>(a.w)[c * kW + j]) : 0.0f;
    dw[j] = 0.0f;
  }
  if (active) {
    const float bias = a.bias != nullptr ? to_f32<T>(static_cast<const T*>(a.bias)[c]) : 0.0f;
    const T* dy = static_cast<const T*>(a.dy);
    T* dx = static_cast<T*>(a.y);
    // At step t, after the shift: xw[i] = xe[t - (W - 1) + i], duw[i] = du[t - (W - 1) + i]
    // (zero before t0: dx[s >= t0] never reads them). Before step t0: xw[i] = xe[t0 - W + i].
    float xw[kW], duw[kW];
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      xw[i] = i == 0 ? 0.0f : conv_xe<T, kW>(a, b, t0 - kW + i, c);
      duw[i] = 0.0f;
    }
    const int64_t tile_end = t0 + kConvTile < a.t ? t0 + kConvTile : a.t;
    // The last s of the tile, tile_end - 1, completes at t = tile_end - 1 + W - 1.
    const int64_t t_end = tile_end + kW - 1;
    for (int64_t t = t0; t < t_end; ++t) {
      const bool in_range = t < a.t;
#pragma unroll
      for (int i = 0; i + 1 < kW; ++i) xw[i] = xw[i + 1];
      xw[kW - 1] = in_range ? conv_xe<T, kW>(a, b, t, c) : 0.0f;
      float du = 0.0f;
      if (in_range) {
        const float g = to_f32<T>(dy[(b * a.t + t) * a.c + c]);
        if (a.act) {
          float u = bias;
#pragma unroll
          for (int j = 0; j < kW; ++j) u += w[j] * xw[j];
          const float sg = conv_sigmoid(u);
          du = g * sg * (1.0f + u * (1.0f - sg));
        } else {
          du = g;
        }
      }
#pragma unroll
      for (int i = 0; i + 1 < kW; ++i) duw[i] = duw[i + 1];
      duw[kW - 1] = du;
      if (t < tile_end) {
#pragma unroll
        for (int j = 0; j < kW; ++j) dw[j] += du * xw[j];
        db += du;
      }
      const int64_t s = t - (kW - 1);
      if (s >= t0) {
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < kW; ++j) v += w[j] * duw[kW - 1 - j];
        dx[(b * a.t + s) * a.c + c] = from_f32<T>(v);
      }
    }
  }
  // (warps, kW + 1, 32): the block's 8 tiles of each channel summed in warp order.
  float* red = mamba_smem;
#pragma unroll
  for (int j = 0; j < kW; ++j) red[(warp * (kW + 1) + j) * 32 + lane] = dw[j];
  red[(warp * (kW + 1) + kW) * 32 + lane] = db;
  __syncthreads();
  const int warps = blockDim.x / 32;
  for (int i = threadIdx.x; i < (kW + 1) * 32; i += blockDim.x) {
    const int j = i / 32, l = i % 32;
    const int64_t cc = static_cast<int64_t>(blockIdx.x) * 32 + l;
    if (cc >= a.c) continue;
    float sum = 0.0f;
    for (int k = 0; k < warps; ++k) sum += red[(k * (kW + 1) + j) * 32 + l];
    if (j < kW)
      atomicAdd(a.dw + cc * kW + j, sum);
    else if (a.db != nullptr)
      atomicAdd(a.db + cc, sum);
  }
}

}  // namespace loom::kernels::cuda::mamba
