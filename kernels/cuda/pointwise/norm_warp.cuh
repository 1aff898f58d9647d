// Layernorm / rmsnorm for the common transformer case, one warp per row: every tensor bf16
// (or every one f16, or every one f32), rows of C elements with C a multiple of 8 and at
// most 2048, every tensor 16-byte aligned. norm.cuh's launchers take these
// kernels then and the general ones (any dtype mix, any width, any alignment) otherwise.
//
// Why a second kernel: the general one switches on each tensor's dtype at run time and keeps
// up to 8 chunks of 4 per lane for rows of up to 16K elements; that costs ~100 registers, so
// an H200 SM holds 16 of its warps, one row each, which is too few loads in flight to keep
// HBM busy (GPT-2's layernorm ran at ~0.8 TB/s, a sixth of the H200's bandwidth, in the
// 2026-11-27 profile). Here the storage type is a template parameter and a lane keeps
// exactly kVecs vectors of 8 elements (16-byte loads and stores; two each in f32): C = 768
// is 3 vectors a lane, C = 2048 is 8. f32 (the default spec's norms, C = 256) came later:
// the general kernel took ~7-9 us a call there (2026-11-27 profile).
//
// The arithmetic is the general kernel's: f32 statistics in two passes over the registers
// (mean, then the mean of squared deviations; RMSNorm: the mean of squares),
// rstd = 1 / sqrtf(var + eps), Y = (x - mean) * rstd * (w + gamma_shift) + b, rounded to T
// once. Only the order of the partial sums differs (a lane's columns, then the warp's
// butterfly). Every product that meets a sum is written as the fmaf nvcc contracts it into
// (norm.cuh says why), so no compiler has a choice left.
//
// The residual-add forms (add_layernorm_* / add_rmsnorm_*, kAdd true) fuse the add into these
// kernels: the forward loads a vector of X and of R, adds them in f32, rounds the sum to T,
// stores it as Z and keeps the ROUNDED values for the statistics and Y, so that Y, mean and
// rstd are exactly what the plain forward of the stored Z would give; the backward adds dZ
// (loaded as T) to dX in f32 before dX's single rounding. With kAdd false (the plain ops) the
// added code is not compiled at all.
//
// Plain CUDA C++ without host-only code, so that tests/kernels/cuda/norm_emulation runs it
// on the CPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/common/device_util.cuh"

namespace loom::kernels::cuda::pointwise {

// Rows (warps) per block of the warp-per-row kernels, and the widest row they take.
inline constexpr int kWarpRowsPerBlock = 8;
inline constexpr int kWarpRowMaxVecs = 8;     // forward: 8 vectors of 8 a lane, C <= 2048
inline constexpr int kWarpRowMaxBwdVecs = 8;  // backward: C <= 2048 (norm.cuh says how)

template <class T>
struct NormFwdWarpArgs {
  const T* x;    // (N, C)
  const T* r;    // (N, C) the residual (kAdd), or null
  T* z;          // (N, C) round(x + r) (kAdd), or null; may alias x or r
  const T* w;    // (C)
  const T* b;    // (C) or null (always null for RMSNorm)
  T* y;          // (N, C)
  float* mean;   // (N); null for RMSNorm
  float* rstd;   // (N)
  int64_t rows;  // N
  int64_t cols;  // C, a multiple of 8, at most 256 * kVecs
  float eps, gamma_shift;
};

// Blocks of kWarpRowsPerBlock warps; warp r of block b takes rows b * kWarpRowsPerBlock + r,
// then strides by the grid. Lane l holds vectors l, l + 32, ..., l + 32 (kVecs - 1) of its
// row (those below C / 8). A warp's row is uniform across its lanes, so the shuffles are.
// kAdd: the row is z = round(x + r), stored as it is loaded; a lane reads x and r of a
// vector before it writes z there, and no other lane touches that vector, so z may alias
// x or r.
template <class T, bool kRms, int kVecs, bool kAdd = false>
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
        load_pack<T, 8>(x + j * 8, v[k]);
        if (kAdd) {
          float r[8];
          load_pack<T, 8>(a.r + row * a.cols + j * 8, r);
          Pack<T, 8> z;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            z.v[e] = from_f32<T>(v[k][e] + r[e]);
            v[k][e] = to_f32<T>(z.v[e]);  // the statistics and Y see the stored Z
          }
          *reinterpret_cast<Pack<T, 8>*>(a.z + row * a.cols + j * 8) = z;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[k][e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sum = kRms ? fmaf(v[k][e], v[k][e], sum) : sum + v[k][e];
    }
    sum = cuda::warp_sum(sum);
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
          sq = fmaf(d, d, sq);
        }
      }
      var = cuda::warp_sum(sq) * inv_c;
    }
    const float rstd = 1.0f / sqrtf(var + a.eps);
    T* y = a.y + row * a.cols;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = static_cast<int64_t>(k) * 32 + lane;
      if (j >= vecs) continue;
      float w[8], b[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      load_pack<T, 8>(a.w + j * 8, w);
      if (!kRms && a.b != nullptr) load_pack<T, 8>(a.b + j * 8, b);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v[k][e] = fmaf((v[k][e] - mean) * rstd, w[e] + a.gamma_shift, b[e]);
      store_pack<T, 8>(y + j * 8, v[k]);
    }
    if (lane == 0) {
      if (!kRms) a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  }
}

// ---- Backward ---------------------------------------------------------------------------
//
// norm_bwd_warp_kernel computes dX, a warp per row with dY and X in registers (as the
// forward). The weight gradients come one of two ways (norm.cuh picks; LOOM_NORM_BWD):
//   - fused (kWgrad): the same kernel adds dY * xhat and dY into column sums that each lane
//     keeps in registers for its columns over the rows its warp visits (grid-stride), then
//     the block adds its warps' sums in warp order through shared memory and writes one
//     partial row per block. dY and X are read once. The sums cost up to 2 * 8 * kVecs
//     registers a lane, so a grid of about two blocks a multiprocessor strides over the rows;
//   - separate: norm_wgrad_cols_kernel, column sums over the rows that read dY and X again
//     (16-byte vectors, 32 consecutive ones per warp), one partial row per block row
//     (blockIdx.y), at the lower register count of the dX kernel alone.
// Either way norm.cuh's norm_wgrad_finalize_kernel adds the partial rows in block order:
// deterministic, as the general kernel with its workspace.
// The arithmetic is the general kernel's: xhat = (x - mean) * rstd, g = dY * (w + shift)
// rounded once (no FMA contraction: C = 1 must give dX = 0 exactly),
// dX = rstd * (g - mean(g) - xhat * mean(g * xhat)) (RMSNorm: no mean(g) term),
// dweight += sum_n dY * xhat, dbias += sum_n dY.
// kAdd (the residual-add forms): x is Z, and dX = that + dZ, added in f32 before the one
// rounding; the weight gradients are the plain op's (of Z).

template <class T>
struct NormBwdWarpArgs {
  const T* dy;         // (N, C)
  const T* x;          // (N, C); Z for the residual-add forms
  const T* dz;         // (N, C) added to dX (kAdd), or null
  const T* w;          // (C)
  const float* mean;   // (N); null for RMSNorm
  const float* rstd;   // (N)
  T* dx;               // (N, C)
  int64_t rows, cols;  // C a multiple of 8, at most 256 * kVecs
  float gamma_shift;
  // kWgrad: the block's partial rows, partial[blockIdx.x][g][c] (g 0: dweight, 1: dbias when
  // want_db), written whole.
  float* partial;
  bool want_db;
};

template <class T, bool kRms, int kVecs, bool kAdd = false, bool kWgrad = false>
__global__ void __launch_bounds__(kWarpRowsPerBlock * 32)
    norm_bwd_warp_kernel(NormBwdWarpArgs<T> a) {
  const int lane = threadIdx.x % 32;
  const int64_t vecs = a.cols / 8;
  const float inv_c = 1.0f / static_cast<float>(a.cols);
  // kWgrad: this lane's columns' sums of dY * xhat and (LayerNorm) dY over its warp's rows.
  float wsum[kWgrad ? kVecs : 1][8] = {}, bsum[kWgrad && !kRms ? kVecs : 1][8] = {};
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
       row < a.rows; row += static_cast<int64_t>(gridDim.x) * kWarpRowsPerBlock) {
    const int64_t off = row * a.cols;
    const float mu = kRms ? 0.0f : a.mean[row], rs = a.rstd[row];
    // Up to 4 vectors a lane (C <= 1024) X stays in registers between the two passes; wider
    // rows read it again in the second (from L1 / L2: the row was just read), which keeps
    // them near the narrower rows' register count instead of ~200.
    constexpr bool kKeepX = kVecs <= 4;
    float d[kVecs][8], xv[kKeepX ? kVecs : 1][8];
    float s0 = 0.0f, s1 = 0.0f;  // sum g, sum g * xhat
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = static_cast<int64_t>(k) * 32 + lane;
      if (j >= vecs) continue;
      float w[8];
      float(&xk)[8] = xv[kKeepX ? k : 0];
      load_pack<T, 8>(a.dy + off + j * 8, d[k]);
      load_pack<T, 8>(a.x + off + j * 8, xk);
      load_pack<T, 8>(a.w + j * 8, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xhat = (xk[e] - mu) * rs, g = __fmul_rn(d[k][e], w[e] + a.gamma_shift);
        s0 += g;
        s1 = fmaf(g, xhat, s1);
        if constexpr (kWgrad) {
          wsum[k][e] = fmaf(d[k][e], xhat, wsum[k][e]);
          if constexpr (!kRms) bsum[k][e] += d[k][e];
        }
      }
    }
    s0 = cuda::warp_sum(s0);
    s1 = cuda::warp_sum(s1);
    const float mg = kRms ? 0.0f : s0 * inv_c, mgx = s1 * inv_c;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = static_cast<int64_t>(k) * 32 + lane;
      if (j >= vecs) continue;
      float w[8];
      float(&xk)[8] = xv[kKeepX ? k : 0];
      if (!kKeepX) load_pack<T, 8>(a.x + off + j * 8, xk);
      load_pack<T, 8>(a.w + j * 8, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xhat = (xk[e] - mu) * rs, g = __fmul_rn(d[k][e], w[e] + a.gamma_shift);
        d[k][e] = rs * fmaf(-xhat, mgx, g - mg);
      }
      if (kAdd) {
        float dz[8];
        load_pack<T, 8>(a.dz + off + j * 8, dz);
#pragma unroll
        for (int e = 0; e < 8; ++e) d[k][e] += dz[e];
      }
      store_pack<T, 8>(a.dx + off + j * 8, d[k]);
    }
  }
  if constexpr (kWgrad) {
    // The block's sums: warp 0's, then each next warp's added, in warp order; then one
    // partial row per gradient.
    __shared__ float block_sum[kRms ? 1 : 2][256 * kWarpRowMaxBwdVecs];
    const int warp = threadIdx.x / 32;
    for (int turn = 0; turn < kWarpRowsPerBlock; ++turn) {
      if (warp == turn) {
#pragma unroll
        for (int k = 0; k < kVecs; ++k) {
          const int64_t j = static_cast<int64_t>(k) * 32 + lane;
          if (j >= vecs) continue;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            float& acc = block_sum[0][j * 8 + e];
            acc = turn == 0 ? wsum[k][e] : acc + wsum[k][e];
            if constexpr (!kRms) {
              float& bacc = block_sum[1][j * 8 + e];
              bacc = turn == 0 ? bsum[k][e] : bacc + bsum[k][e];
            }
          }
        }
      }
      __syncthreads();
    }
    const int grads = !kRms && a.want_db ? 2 : 1;
    for (int64_t i = threadIdx.x; i < grads * a.cols; i += blockDim.x) {
      const int g = static_cast<int>(i / a.cols);
      const int64_t c = i % a.cols;
      a.partial[(static_cast<int64_t>(blockIdx.x) * grads + g) * a.cols + c] = block_sum[g][c];
    }
  }
}

// Column sums of dY * xhat (and of dY when `want_db`): blocks of 32 x 8 threads; x across
// 32 vectors (256 columns) from blockIdx.x * 256, y over rows blockIdx.y * 8 + y, then by
// gridDim.y * 8. Each block writes its partial row(s) to partial[blockIdx.y][grad][c] (grad
// 0: dweight, 1: dbias), the 8 row groups added in order.
template <class T, bool kRms>
__global__ void __launch_bounds__(256)
    norm_wgrad_cols_kernel(NormBwdWarpArgs<T> a, bool want_db, float* partial) {
  __shared__ float sums[2][8][257];  // [grad][row group][column of the block], padded
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t vecs = a.cols / 8, j = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  float dw[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  float db[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (j < vecs) {
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * 8 + ty; row < a.rows;
         row += static_cast<int64_t>(gridDim.y) * 8) {
      const float mu = kRms ? 0.0f : a.mean[row], rs = a.rstd[row];
      float d[8], xv[8];
      load_pack<T, 8>(a.dy + row * a.cols + j * 8, d);
      load_pack<T, 8>(a.x + row * a.cols + j * 8, xv);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        dw[e] = fmaf(d[e], (xv[e] - mu) * rs, dw[e]);
        db[e] += d[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    sums[0][ty][tx * 8 + e] = dw[e];
    sums[1][ty][tx * 8 + e] = db[e];
  }
  __syncthreads();
  const int grads = want_db ? 2 : 1;
  for (int i = threadIdx.x; i < grads * 256; i += blockDim.x) {
    const int g = i / 256, col = i % 256;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 256 + col;
    if (c >= a.cols) continue;
    float t = 0.0f;
    for (int r = 0; r < 8; ++r) t += sums[g][r][col];
    partial[(static_cast<int64_t>(blockIdx.y) * grads + g) * a.cols + c] = t;
  }
}

}  // namespace loom::kernels::cuda::pointwise
