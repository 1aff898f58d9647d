// Device helpers of the bandwidth-bound CUDA kernels (the gemm, loss, optim and elementwise
// families): packed loads and stores of any float storage type, block reductions, the grid
// sizes of the grid-stride kernels, and the element count of their cost.
#pragma once

#include <stdint.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/dtype.cuh"

namespace loom::kernels::cuda {

// ---- Packed memory access ---------------------------------------------------------------

// W consecutive elements of T, aligned so that one load or store moves them when W *
// sizeof(T) <= 16 bytes (wider packs split into 16-byte accesses, alignment still 16).
template <class T, int W>
struct alignas(W * sizeof(T) < 16 ? W * sizeof(T) : 16) Pack {
  T v[W];
};

// Bytes a pointer must be aligned to for Pack<T, W>.
template <class T, int W>
constexpr uintptr_t pack_alignment() {
  return W * sizeof(T) < 16 ? W * sizeof(T) : 16;
}

// Loads W elements at p (aligned for Pack<T, W>) as f32.
template <class T, int W>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[W]) {
  Pack<T, W> r = *reinterpret_cast<const Pack<T, W>*>(p);
#pragma unroll
  for (int i = 0; i < W; ++i) out[i] = to_f32<T>(r.v[i]);
}

// Stores W f32 values at p (aligned for Pack<T, W>), rounded to T.
template <class T, int W>
__device__ __forceinline__ void store_pack(T* p, const float (&in)[W]) {
  Pack<T, W> r;
#pragma unroll
  for (int i = 0; i < W; ++i) r.v[i] = from_f32<T>(in[i]);
  *reinterpret_cast<Pack<T, W>*>(p) = r;
}

// True when `p` is aligned to `bytes` (a power of two); null counts as aligned.
__host__ __device__ inline bool is_aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Elements of size `elem` from `p` to the next 16-byte boundary (0 when aligned). `p` must
// be aligned to `elem`, as every element pointer of a tensor is.
__device__ __forceinline__ int64_t head_to_16(const void* p, int elem) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return static_cast<int64_t>(((16 - a % 16) % 16) / static_cast<uintptr_t>(elem));
}

// ---- Reductions ---------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of `v` over the block, in a fixed order (deterministic). blockDim.x must be a
// multiple of 32 and at most 1024; every thread must call it. The result is valid in
// thread 0 (other threads get partial sums). Ends with a barrier, so it may be called again.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : T(0);
    v = warp_sum(v);
  }
  __syncthreads();
  return v;
}

// ---- Launch geometry ------------------------------------------------------------------------

// Threads per block of the grid-stride elementwise kernels.
inline constexpr int kThreads = 256;
// Grid-stride kernels launch at most this many blocks: 4096 x 256 threads is about 8 waves
// of a 132-SM H100 at full occupancy, plenty to saturate memory; larger problems loop.
inline constexpr int64_t kMaxBlocks = 4096;

// Blocks of `threads` threads for `items` work items, capped at `cap` (grid-stride loops
// cover the rest); at least 1.
inline unsigned grid_for(int64_t items, int threads, int64_t cap = kMaxBlocks) {
  int64_t b = (items + threads - 1) / threads;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// ---- Costs -------------------------------------------------------------------------------

// Largest element count among the call's tensors (the "n" of a bandwidth-bound op's cost).
inline int64_t max_numel(const OpCall* call) {
  int64_t n = 0;
  for (int32_t i = 0; i < call->num_inputs; ++i)
    if (numel(call->inputs[i]) > n) n = numel(call->inputs[i]);
  for (int32_t i = 0; i < call->num_outputs; ++i)
    if (numel(call->outputs[i]) > n) n = numel(call->outputs[i]);
  return n;
}

}  // namespace loom::kernels::cuda
