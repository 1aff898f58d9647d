// The row kernels of cross_entropy_fwd / _bwd / _fwd_bwd (cross_entropy.cu, which launches
// them and describes the scheme): the forward's fold of a row into (max, sum of exp), the
// backward's elementwise gradient of a row, and the one pass that does both, its row staged
// through shared memory or read twice. Device code only, so that
// tests/kernels/cuda/loss_emulation runs it on the CPU.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/loss/cross_entropy.cuh"
#include "kernels/cuda/loss/label_errors.cuh"

namespace loom::kernels::cuda::loss {

// The block's dynamic shared memory, where the one pass stages its row.
#if defined(__CUDACC__)
__device__ __forceinline__ uint4* ce_stage_words() {
  extern __shared__ uint4 ce_dynamic_smem[];
  return ce_dynamic_smem;
}
#else
uint4* ce_stage_words();  // the CPU emulation's stand-in (tests/kernels/cuda/loss_emulation)
#endif

template <class T>
__global__ void ce_fwd_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                              const float* __restrict__ mask, float* __restrict__ loss,
                              float* __restrict__ lse, int64_t N, int64_t V, int64_t valid,
                              LabelErrorSink sink) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;  // columns [valid, V) are padding
    const MaxSum ms = block_max_sum(row_max_sum(row, valid));
    if (threadIdx.x == 0) {
      const float log_sum = logf(ms.s);
      lse[n] = ms.m + log_sum;
      const int32_t label = labels[n];
      const float w = mask != nullptr ? mask[n] : 1.0f;
      if (label >= 0 && label < valid) {
        loss[n] = (ms.m - to_f32<T>(row[label])) + log_sum;
      } else if (w != 0.0f) {
        report_label_error(sink, LabelOp::kFwd, n, label, valid);
        loss[n] = NAN;
      } else {
        loss[n] = 0.0f;
      }
    }
  }
}

// One row of the backward: y[j] = w * (exp(x[j] - lse) - (j == col)), or 0 when w == 0 or
// j >= valid (padding).
template <class T, class D>
__device__ void ce_bwd_row(const T* __restrict__ x, D* __restrict__ y, int64_t V, int64_t valid,
                           float w, float lse, int64_t col) {
  constexpr int W = 16 / sizeof(T) > 16 / sizeof(D) ? 16 / sizeof(T) : 16 / sizeof(D);
  auto grad = [&](int64_t j, float v) {
    if (w == 0.0f || j >= valid) return 0.0f;
    return w * (exp2f((v - lse) * kLog2e) - (j == col ? 1.0f : 0.0f));
  };
  int64_t head = head_to_16(x, sizeof(T));
  if (head != head_to_16(y, sizeof(D))) head = V;  // rows aligned differently: all scalar
  if (head > V) head = V;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x)
    y[j] = from_f32<D>(grad(j, to_f32<T>(x[j])));
  const int64_t packs = (V - head) / W;
#pragma unroll 2
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const int64_t j0 = head + p * W;
    float v[W];
    load_pack<T, W>(x + j0, v);
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = grad(j0 + i, v[i]);
    store_pack<D, W>(y + j0, v);
  }
  for (int64_t j = head + packs * W + threadIdx.x; j < V; j += blockDim.x)
    y[j] = from_f32<D>(grad(j, to_f32<T>(x[j])));
}

template <class T, class D>
__global__ void ce_bwd_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                              const float* __restrict__ mask, const float* __restrict__ lse,
                              const float* __restrict__ dmean, const double* mask_total_dev,
                              double mask_total_host, D* __restrict__ dlogits, int64_t N, int64_t V,
                              int64_t valid, int64_t start, int64_t vocab, LabelErrorSink sink) {
  // The same few scalars in every thread: broadcast loads, no barrier needed.
  const double total = mask_total_dev != nullptr ? *mask_total_dev : mask_total_host;
  const double dm = dmean[0];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float mk = mask != nullptr ? mask[n] : 1.0f;
    const float w = total != 0.0 ? static_cast<float>(dm * mk / total) : 0.0f;
    const int32_t label = labels[n];
    const int64_t col = label - start >= 0 && label - start < valid ? label - start : -1;
    if (threadIdx.x == 0 && mk != 0.0f && (label < 0 || label >= vocab))
      report_label_error(sink, LabelOp::kBwd, n, label, vocab);
    ce_bwd_row<T, D>(logits + n * V, dlogits + n * V, V, valid, w, lse[n], col);
  }
}

// Copies row[0, V) into `stage`, which has the row's alignment modulo 16 bytes, so that
// row_max_sum and ce_bwd_row split the copy into the same head, packs and tail as the row.
template <class T>
__device__ void stage_row(const T* __restrict__ row, T* __restrict__ stage, int64_t V) {
  constexpr int W = 16 / sizeof(T);
  int64_t head = head_to_16(row, sizeof(T));
  if (head > V) head = V;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) stage[j] = row[j];
  const int64_t packs = (V - head) / W;
  const uint4* src = reinterpret_cast<const uint4*>(row + head);
  uint4* dst = reinterpret_cast<uint4*>(stage + head);
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) dst[p] = src[p];
  for (int64_t j = head + packs * W + threadIdx.x; j < V; j += blockDim.x) stage[j] = row[j];
  __syncthreads();
}

// kStaged: the rows go through dynamic shared memory of V * sizeof(T) + 16 bytes.
template <class T, class D, bool kStaged>
__global__ void ce_fwd_bwd_kernel(const T* logits, const int32_t* __restrict__ labels,
                                  const float* __restrict__ mask, float* __restrict__ loss,
                                  float* __restrict__ lse, const float* __restrict__ dmean,
                                  const double* mask_total_dev, double mask_total_host, D* dlogits,
                                  int64_t N, int64_t V, int64_t valid, LabelErrorSink sink) {
  // logits and dlogits without __restrict__: they may be one buffer (in place).
  uint4* stage_words = ce_stage_words();
  __shared__ float row_lse;
  const double total = mask_total_dev != nullptr ? *mask_total_dev : mask_total_host;
  const double dm = dmean[0];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;  // may be dlogits' row itself: read whole before writes
    if constexpr (kStaged) {
      T* stage =
          reinterpret_cast<T*>(stage_words) + (reinterpret_cast<uintptr_t>(row) % 16) / sizeof(T);
      stage_row(row, stage, V);
      row = stage;
    }
    const MaxSum ms = block_max_sum(row_max_sum(row, valid));
    const float mk = mask != nullptr ? mask[n] : 1.0f;
    const int32_t label = labels[n];
    if (threadIdx.x == 0) {
      const float log_sum = logf(ms.s);
      const float l = ms.m + log_sum;
      lse[n] = l;
      row_lse = l;
      if (label >= 0 && label < valid) {
        loss[n] = (ms.m - to_f32<T>(row[label])) + log_sum;
      } else if (mk != 0.0f) {
        report_label_error(sink, LabelOp::kFwdBwd, n, label, valid);
        loss[n] = NAN;
      } else {
        loss[n] = 0.0f;
      }
    }
    __syncthreads();
    const float w = total != 0.0 ? static_cast<float>(dm * mk / total) : 0.0f;
    const int64_t col = label >= 0 && label < valid ? label : -1;
    ce_bwd_row<T, D>(row, dlogits + n * V, V, valid, w, row_lse, col);
    __syncthreads();  // row_lse and the stage are the next row's
  }
}

}  // namespace loom::kernels::cuda::loss
