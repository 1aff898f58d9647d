// Device code shared by cross_entropy.cu and cross_entropy_shard.cu: the online max /
// sum-of-exp of a row of logits (never materialising probabilities), its block reduction,
// and the launchers of the small kernels both files use.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/common/device_util.cuh"

namespace loom::kernels::cuda::loss {

constexpr float kLog2e = 1.4426950408889634f;

// Max m of a set of logits and s = sum exp(x - m) over it. An empty set is (-inf, 0); a NaN
// logit makes s NaN (as in the CPU reference), and m never holds NaN (fmaxf drops it).
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum max_sum_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  // A side with m = -inf holds no finite logit: its s is 0, or NaN, which must survive.
  const float sa = a.m == -INFINITY ? a.s : a.s * exp2f((a.m - m) * kLog2e);
  const float sb = b.m == -INFINITY ? b.s : b.s * exp2f((b.m - m) * kLog2e);
  return {m, sa + sb};
}

// Folds W logits into `acc`: one rescale per pack (when its max is new), one exp2 per logit.
template <int W>
__device__ __forceinline__ void max_sum_add(MaxSum& acc, const float (&x)[W]) {
  float pm = x[0];
#pragma unroll
  for (int i = 1; i < W; ++i) pm = fmaxf(pm, x[i]);
  if (pm > acc.m) {
    acc.s *= exp2f((acc.m - pm) * kLog2e);  // exp2(-inf) = 0 on the first finite pack
    acc.m = pm;
  }
#pragma unroll
  for (int i = 0; i < W; ++i) acc.s += x[i] == -INFINITY ? 0.0f : exp2f((x[i] - acc.m) * kLog2e);
}

// This thread's share of one row of V logits: 16-byte packs from the row's first 16-byte
// boundary on, single elements before it and after the last whole pack (rows of an odd V
// start anywhere).
template <class T>
__device__ MaxSum row_max_sum(const T* __restrict__ row, int64_t V) {
  constexpr int W = 16 / sizeof(T);
  MaxSum acc{-INFINITY, 0.0f};
  int64_t head = head_to_16(row, sizeof(T));
  if (head > V) head = V;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    const float x[1] = {to_f32<T>(row[j])};
    max_sum_add<1>(acc, x);
  }
  const int64_t packs = (V - head) / W;
  const T* body = row + head;
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    float x[W];
    load_pack<T, W>(body + p * W, x);
    max_sum_add<W>(acc, x);
  }
  for (int64_t j = head + packs * W + threadIdx.x; j < V; j += blockDim.x) {
    const float x[1] = {to_f32<T>(row[j])};
    max_sum_add<1>(acc, x);
  }
  return acc;
}

// The block's MaxSum, valid in thread 0. Every thread must call it; ends with a barrier.
__device__ inline MaxSum block_max_sum(MaxSum v) {
  __shared__ MaxSum partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
    v = max_sum_merge(v, o);
  }
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : MaxSum{-INFINITY, 0.0f};
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, offset),
               __shfl_xor_sync(0xffffffffu, v.s, offset)};
      v = max_sum_merge(v, o);
    }
  }
  __syncthreads();
  return v;
}

// Threads per row block: enough 16-byte loads in flight for a long row, few idle threads
// for a short one.
inline int row_threads(int64_t V) { return V >= 8192 ? 512 : V >= 1024 ? 256 : 128; }

// Row blocks per launch: one block per row up to this many, then grid-stride.
inline constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

// mean[0] = sum mask * loss / sum mask over the N rows (0 when the mask sums to 0; a null
// mask counts 1 per row), in f64, by one block on `stream`; rows with mask 0 are skipped
// (their loss may be NaN). Defined in cross_entropy.cu.
void launch_masked_mean(const float* loss, const float* mask, int64_t n, float* mean,
                        cudaStream_t stream, const char* op);

}  // namespace loom::kernels::cuda::loss
