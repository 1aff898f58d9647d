// The kernels shared by layernorm.cu, rmsnorm.cu and add_norm.cu (kRms picks RMSNorm: no mean,
// no bias), and their host-side launchers. The launchers take the call's tensors as
// NormFwdTensors / NormBwdTensors, so that the residual-add forms (add_norm.cu) reuse them
// with their own argument layout and, on the warp-per-row path, the fused kernels (kAdd).
//
// Forward, per row of X (N, C): the row is read once into registers (row_team.cuh, 8 chunks
// of 4 per lane), then mean (LayerNorm) and the variance around it are two team sums over
// the registers (two passes in f32: no cancellation, unlike E[x^2] - E[x]^2), and
// Y = (x - mean) * rstd * gamma + beta is written from the registers.
//
// Backward, per row: dY and X in registers (4 chunks per lane); one team sum of the pair
// (sum g, sum g * xhat), g = dY * gamma, xhat = (x - mean) * rstd; then
// dX = rstd * (g - mean(g) - xhat * mean(g * xhat)) (RMSNorm: no mean(g) term).
//
// Contraction. Every product that meets a sum is written as the fmaf it is meant to be
// (sum = fmaf(x, x, sum), Y = fmaf((x - mean) * rstd, gamma, beta), dX = rstd * fmaf(-xhat,
// mean(g * xhat), g - mean(g))) and g as __fmul_rn, so that no compiler chooses: nvcc's
// contraction of a * b + c happens partly in NVVM and partly in ptxas, and the host compiler
// that builds the CPU emulation of these kernels contracts at -O3 -march=haswell and not at
// -O0. Left to them, two instantiations of one expression could round differently (the
// add forms' Y is claimed to be the plain forward's of Z, bit for bit), and the emulation
// would not compute what the GPU does.
//
// Weight gradients, two stages. Stage 1: each thread owns the same columns in every row its
// team handles (the row-team layout), so it sums dY * xhat (dweight) and dY (dbias) over
// those rows in registers, with no atomics; at the end the teams of a block combine in
// team order through shared memory. Stage 2 depends on the workspace:
//  - with the workspace (norm_bwd_workspace bytes: one f32 partial row per block and
//    gradient), each block stores its partial row, and a second kernel adds the partials of
//    every block in a fixed order into dweight / dbias: deterministic, run to run.
//  - without it (a caller that gives none), each block adds its partial row into dweight /
//    dbias with atomics: the same sums, in an order that may vary in the last bits.
// The number of blocks is capped at about 128K threads' worth (enough to keep HBM busy). The
// partials are blocks x gradients x C f32: a few MiB for transformer widths (C = 4096: about
// 8 MiB), 32 MiB at C = 16384, a few percent of the backward's traffic; past the columns a
// lane keeps in registers (C > 8192), a block also updates its partial row in global memory
// (mostly L2) on every row.
#pragma once

#include <loom/cpp/op_checks/norms.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/norm_warp.cuh"
#include "kernels/cuda/pointwise/row_team.cuh"

namespace loom::kernels::cuda::pointwise {

inline constexpr int kNormFwdChunks = 8;  // chunks of 4 per lane in registers, forward
inline constexpr int kNormBwdChunks = 4;  // backward (dY and X both cached)
inline constexpr int64_t kNormBwdThreads = int64_t{1} << 17;  // stage-1 threads, at most

struct NormFwdArgs {
  const void* x;  // (N, C)
  const void* w;  // (C)
  const void* b;  // (C) or null (always null for RMSNorm)
  void* y;        // (N, C)
  float* mean;    // (N); null for RMSNorm
  float* rstd;    // (N)
  DType xt, wt, bt, yt;
  int64_t rows, cols;
  float eps, gamma_shift;  // gamma = weight + gamma_shift
  int tpr;
  bool vec;  // C % 4 == 0 and every tensor aligned to 4 elements
};

template <bool kRms>
__global__ void __launch_bounds__(kMaxTeam) norm_fwd_kernel(NormFwdArgs a) {
  __shared__ TeamScratch<1> scratch;
  const int team = threadIdx.x / a.tpr, lane = threadIdx.x % a.tpr;
  const int teams = blockDim.x / a.tpr;
  const float inv_c = 1.0f / static_cast<float>(a.cols);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * teams; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * teams) {
    const int64_t row = base + team;
    const bool active = row < a.rows;
    const int64_t off = (active ? row : 0) * a.cols, end = off + a.cols;
    float v[kNormFwdChunks][4];
    // A chunk of X: from registers, or from memory past the register capacity.
    auto x_chunk = [&](int k, int64_t c, float t[4]) {
      if (k >= 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) t[e] = v[k][e];
      } else if (active) {
        load4(a.x, a.xt, off + c, end, a.vec, t);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) t[e] = 0.0f;
      }
    };
    float sum[1] = {0.0f};
    for_each_chunk<kNormFwdChunks>(lane, a.tpr, a.cols, [&](int k, int64_t c) {
      float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (active) load4(a.x, a.xt, off + c, end, a.vec, t);  // 0 past the row's end
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (k >= 0) v[k][e] = t[e];
        sum[0] = kRms ? fmaf(t[e], t[e], sum[0]) : sum[0] + t[e];
      }
    });
    team_sum(sum, a.tpr, scratch);
    float mean = 0.0f, var;
    if (kRms) {
      var = sum[0] * inv_c;  // mean of squares
    } else {
      mean = sum[0] * inv_c;
      float sq[1] = {0.0f};
      for_each_chunk<kNormFwdChunks>(lane, a.tpr, a.cols, [&](int k, int64_t c) {
        float t[4];
        x_chunk(k, c, t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float d = c + e < a.cols ? t[e] - mean : 0.0f;
          sq[0] = fmaf(d, d, sq[0]);
        }
      });
      team_sum(sq, a.tpr, scratch);
      var = sq[0] * inv_c;
    }
    const float rstd = 1.0f / sqrtf(var + a.eps);
    if (active) {
      for_each_chunk<kNormFwdChunks>(lane, a.tpr, a.cols, [&](int k, int64_t c) {
        float t[4], w[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        x_chunk(k, c, t);
        load4(a.w, a.wt, c, a.cols, a.vec, w);
        if (!kRms && a.b != nullptr) load4(a.b, a.bt, c, a.cols, a.vec, b);
#pragma unroll
        for (int e = 0; e < 4; ++e) t[e] = fmaf((t[e] - mean) * rstd, w[e] + a.gamma_shift, b[e]);
        store4(a.y, a.yt, off + c, end, a.vec, t);
      });
      if (lane == 0) {
        if (!kRms) a.mean[row] = mean;
        a.rstd[row] = rstd;
      }
    }
  }
}

struct NormBwdArgs {
  const void* dy;     // (N, C)
  const void* x;      // (N, C)
  const void* w;      // (C)
  const float* mean;  // (N); null for RMSNorm
  const float* rstd;  // (N)
  void* dx;           // (N, C)
  float* dw;          // (C) +=
  float* db;          // (C) += or null
  float* partial;     // (gridDim.x, grads, C) workspace, or null: atomics into dw / db
  DType dyt, xt, wt, dxt;
  int64_t rows, cols;
  float gamma_shift;
  int tpr;
  bool vec;
};

template <bool kRms>
__global__ void __launch_bounds__(kMaxTeam) norm_bwd_kernel(NormBwdArgs a) {
  __shared__ TeamScratch<2> scratch;
  extern __shared__ float combine[];  // (grads, C) when the block has several teams
  const int team = threadIdx.x / a.tpr, lane = threadIdx.x % a.tpr;
  const int teams = blockDim.x / a.tpr;
  const bool want_db = !kRms && a.db != nullptr;
  const int grads = want_db ? 2 : 1;
  const float inv_c = 1.0f / static_cast<float>(a.cols);
  float* part = a.partial != nullptr ? a.partial + blockIdx.x * grads * a.cols : nullptr;

  // Columns past the register capacity (only with one team per block) accumulate in the
  // block's partial row, which this thread owns there: clear it first.
  if (part != nullptr)
    for (int64_t c = (static_cast<int64_t>(kNormBwdChunks) * a.tpr + lane) * 4; c < a.cols;
         c += static_cast<int64_t>(a.tpr) * 4)
      for (int e = 0; e < 4 && c + e < a.cols; ++e)
        for (int g = 0; g < grads; ++g) part[g * a.cols + c + e] = 0.0f;

  float dwa[kNormBwdChunks][4] = {}, dba[kNormBwdChunks][4] = {};
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * teams; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * teams) {
    const int64_t row = base + team;
    const bool active = row < a.rows;
    const int64_t off = (active ? row : 0) * a.cols, end = off + a.cols;
    const float mu = !kRms && active ? a.mean[row] : 0.0f;
    const float rs = active ? a.rstd[row] : 0.0f;
    float xs[kNormBwdChunks][4], gs[kNormBwdChunks][4];
    // dY and X of a chunk (zeros past the row's end and for an inactive team).
    auto chunk = [&](int k, int64_t c, float d[4], float x[4]) {
      if (k >= 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) d[e] = gs[k][e], x[e] = xs[k][e];
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) d[e] = x[e] = 0.0f;
        if (active) {
          load4(a.dy, a.dyt, off + c, end, a.vec, d);
          load4(a.x, a.xt, off + c, end, a.vec, x);
        }
      }
    };
    float sums[2] = {0.0f, 0.0f};  // sum g, sum g * xhat
    for_each_chunk<kNormBwdChunks>(lane, a.tpr, a.cols, [&](int k, int64_t c) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, x[4] = {0.0f, 0.0f, 0.0f, 0.0f}, w[4];
      if (active) {
        load4(a.dy, a.dyt, off + c, end, a.vec, d);
        load4(a.x, a.xt, off + c, end, a.vec, x);
      }
      load4(a.w, a.wt, c, a.cols, a.vec, w);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // g rounded once (__fmul_rn: no FMA contraction), as in the second pass below.
        const float xhat = (x[e] - mu) * rs, g = __fmul_rn(d[e], w[e] + a.gamma_shift);
        sums[0] += g;  // d is 0 past the row's end, and so is g
        sums[1] = fmaf(g, xhat, sums[1]);
        if (k >= 0) {
          gs[k][e] = d[e];
          xs[k][e] = x[e];
          dwa[k][e] = fmaf(d[e], xhat, dwa[k][e]);
          dba[k][e] += d[e];
        } else if (active && c + e < a.cols) {
          if (part != nullptr) {
            part[c + e] = fmaf(d[e], xhat, part[c + e]);
            if (want_db) part[a.cols + c + e] += d[e];
          } else {
            atomicAdd(a.dw + c + e, d[e] * xhat);
            if (want_db) atomicAdd(a.db + c + e, d[e]);
          }
        }
      }
    });
    team_sum(sums, a.tpr, scratch);
    const float mg = kRms ? 0.0f : sums[0] * inv_c, mgx = sums[1] * inv_c;
    if (active) {
      for_each_chunk<kNormBwdChunks>(lane, a.tpr, a.cols, [&](int k, int64_t c) {
        float d[4], x[4], w[4];
        chunk(k, c, d, x);
        load4(a.w, a.wt, c, a.cols, a.vec, w);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // The g the sums saw: contracted into fma(d, w, -mg), g - mg would keep the
          // product's rounding error (times rstd) where it must be 0 (C = 1).
          const float xhat = (x[e] - mu) * rs, g = __fmul_rn(d[e], w[e] + a.gamma_shift);
          d[e] = rs * fmaf(-xhat, mgx, g - mg);
        }
        store4(a.dx, a.dxt, off + c, end, a.vec, d);
      });
    }
  }

  // Stage 1's end: this block's sums of its register columns, teams combined in order.
  if (teams == 1) {
#pragma unroll
    for (int k = 0; k < kNormBwdChunks; ++k) {
      const int64_t c = (static_cast<int64_t>(k) * a.tpr + lane) * 4;
      for (int e = 0; e < 4 && c + e < a.cols; ++e) {
        if (part != nullptr) {
          part[c + e] = dwa[k][e];
          if (want_db) part[a.cols + c + e] = dba[k][e];
        } else {
          atomicAdd(a.dw + c + e, dwa[k][e]);
          if (want_db) atomicAdd(a.db + c + e, dba[k][e]);
        }
      }
    }
    return;
  }
  for (int t = 0; t < teams; ++t) {
    if (team == t) {
#pragma unroll
      for (int k = 0; k < kNormBwdChunks; ++k) {
        const int64_t c = (static_cast<int64_t>(k) * a.tpr + lane) * 4;
        for (int e = 0; e < 4 && c + e < a.cols; ++e) {
          combine[c + e] = (t == 0 ? 0.0f : combine[c + e]) + dwa[k][e];
          if (want_db)
            combine[a.cols + c + e] = (t == 0 ? 0.0f : combine[a.cols + c + e]) + dba[k][e];
        }
      }
    }
    __syncthreads();
  }
  for (int64_t i = threadIdx.x; i < grads * a.cols; i += blockDim.x) {
    if (part != nullptr)
      part[i] = combine[i];
    else if (i < a.cols)
      atomicAdd(a.dw + i, combine[i]);
    else
      atomicAdd(a.db + (i - a.cols), combine[i]);
  }
}

// Stage 2 with the workspace: grad[c] += sum over blocks of partial[block][g][c], in block
// order. Blocks of 32 x 32 threads: x across 32 columns, y over slices of the blocks;
// blockIdx.y picks the gradient (0 dweight, 1 dbias). A template (on kRms only) so that
// every .cu file that includes this header may instantiate it.
template <bool kRms>
__global__ void norm_wgrad_finalize_kernel(const float* partial, int64_t blocks, int grads,
                                           int64_t cols, float* dw, float* db) {
  __shared__ float s[32][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int g = blockIdx.y;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t b = threadIdx.y; b < blocks; b += 32) acc += partial[(b * grads + g) * cols + c];
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
    for (int i = 0; i < 32; ++i) t += s[i][threadIdx.x];
    (g == 0 ? dw : db)[c] += t;
  }
}

// ---- Host side -------------------------------------------------------------------------

inline RowGeometry norm_fwd_geometry(int64_t rows, int64_t cols) {
  return row_geometry(rows, cols, kNormFwdChunks, kMaxGridBlocks);
}

inline RowGeometry norm_bwd_geometry(int64_t rows, int64_t cols) {
  RowGeometry g = row_geometry(rows, cols, kNormBwdChunks, kMaxGridBlocks);
  int64_t cap = std::max<int64_t>(1, kNormBwdThreads / g.block);
  if (g.grid > cap) g.grid = static_cast<unsigned>(cap);
  return g;
}

// Block rows of norm_wgrad_cols_kernel (norm_warp.cuh): about 1024 blocks in all, each
// with at least 8 rows to sum. Rows narrower than 8 (never that kernel's case, but the
// workspace size asks for every shape) count as one column block.
inline int64_t norm_wgrad_cols_slices(int64_t rows, int64_t cols) {
  const int64_t x = std::max<int64_t>(1, (cols / 8 + 31) / 32);
  return std::clamp<int64_t>(1024 / x, 1, std::min<int64_t>((rows + 7) / 8, 65535));
}

// Blocks of the fused warp-per-row backward (norm_warp.cuh, kWgrad): two a multiprocessor
// (one wave at either of its occupancies: the column sums' registers allow one or two
// 256-thread blocks), never more than the workspace's partial rows
// (kNormFusedMaxBlocks, which the workspace always holds) or than 8-row groups.
inline constexpr int64_t kNormFusedMaxBlocks = 512;
inline int64_t norm_fused_blocks(int64_t rows, int multiprocessors) {
  return std::clamp<int64_t>(std::min<int64_t>(2 * static_cast<int64_t>(multiprocessors),
                                               (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock),
                             1, kNormFusedMaxBlocks);
}

// The weight gradients of the warp-per-row backward: fused into the dX kernel (the default),
// or LOOM_NORM_BWD=separate for norm_wgrad_cols_kernel, to measure one against the other.
inline bool norm_bwd_fused() {
  static const bool separate =
      env_choice("norm backward", "LOOM_NORM_BWD", {"fused", "separate"}) == 1;
  return !separate;
}

// Workspace bytes of a backward call: one f32 partial row per block (block row, for the
// warp-per-row backward) and gradient, for whichever kernel the call takes.
inline uint64_t norm_bwd_workspace_bytes(int64_t rows, int64_t cols, int grads) {
  if (rows == 0 || cols == 0) return 0;
  const int64_t blocks = std::max({static_cast<int64_t>(norm_bwd_geometry(rows, cols).grid),
                                   norm_wgrad_cols_slices(rows, cols),
                                   std::min<int64_t>(kNormFusedMaxBlocks, (rows + 7) / 8)});
  return static_cast<uint64_t>(blocks) * grads * static_cast<uint64_t>(cols) * sizeof(float);
}

// True when a norm call is the warp-per-row kernels' case: every tensor (null ones skipped)
// of the first one's dtype, bf16, f16 or f32, and 16-byte aligned; C a multiple of 8 of at
// most 256 * max_vecs (norm_warp.cuh).
inline bool norm_warp_case(std::initializer_list<const TensorView*> tensors, int64_t cols,
                           int max_vecs) {
  const DType t = (*tensors.begin())->dtype;
  if ((t != DType::kBF16 && t != DType::kF16 && t != DType::kF32) || cols % 8 != 0 ||
      cols > 256 * int64_t{max_vecs})
    return false;
  for (const TensorView* v : tensors)
    if (v != nullptr && (v->dtype != t || reinterpret_cast<uintptr_t>(v->data) % 16 != 0))
      return false;
  return true;
}

// norm_fwd_warp_kernel<T, kRms, kVecs, kAdd> for a row of `cols` elements: the fewest
// vectors a lane needs.
template <class T, bool kRms, bool kAdd = false>
void launch_norm_fwd_warp(const NormFwdWarpArgs<T>& a, cudaStream_t stream) {
  const int vecs = static_cast<int>((a.cols / 8 + 31) / 32);
  const int64_t blocks = (a.rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
  const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxGridBlocks));
  const int threads = kWarpRowsPerBlock * 32;
  switch (vecs) {
    case 1:
      norm_fwd_warp_kernel<T, kRms, 1, kAdd><<<grid, threads, 0, stream>>>(a);
      break;
    case 2:
      norm_fwd_warp_kernel<T, kRms, 2, kAdd><<<grid, threads, 0, stream>>>(a);
      break;
    case 3:
      norm_fwd_warp_kernel<T, kRms, 3, kAdd><<<grid, threads, 0, stream>>>(a);
      break;
    case 4:
      norm_fwd_warp_kernel<T, kRms, 4, kAdd><<<grid, threads, 0, stream>>>(a);
      break;
    case 5:
    case 6:
      norm_fwd_warp_kernel<T, kRms, 6, kAdd><<<grid, threads, 0, stream>>>(a);
      break;
    default:
      norm_fwd_warp_kernel<T, kRms, 8, kAdd><<<grid, threads, 0, stream>>>(a);
      break;
  }
}

// The tensors of a forward call, whichever op's layout they come from: the plain ops
// (r, z null) or the residual-add forms (x + r -> z, then the norm of z).
struct NormFwdTensors {
  const TensorView* x;  // (N, C)
  const TensorView* r;  // (N, C) or null
  const TensorView* w;  // (C)
  const TensorView* b;  // (C) or null (always null for RMSNorm)
  const TensorView* y;  // (N, C)
  const TensorView* z;  // (N, C) or null; may alias x or r
  float* mean;          // (N); null for RMSNorm
  float* rstd;          // (N)
};

// The plain forward's tensors: X, weight[, bias] -> Y[, mean], rstd.
template <bool kRms>
NormFwdTensors norm_fwd_tensors(const OpCall* call) {
  const TensorView* B = !kRms && call->inputs[2].data != nullptr ? &call->inputs[2] : nullptr;
  return {&call->inputs[0],
          nullptr,
          &call->inputs[1],
          B,
          &call->outputs[0],
          nullptr,
          kRms ? nullptr : static_cast<float*>(call->outputs[1].data),
          static_cast<float*>(call->outputs[kRms ? 1 : 2].data)};
}

// The warp-per-row forward (norm_warp.cuh) when the call is its case: X, weight, bias and Y
// (and, kAdd, R and Z) all bf16, all f16 or all f32, C a multiple of 8 and at most 2048, every
// tensor 16-byte aligned. kAdd (t.r and t.z set) fuses the add; a template parameter so that the
// plain ops' files do not compile the fused kernels. False (nothing launched) otherwise.
template <bool kRms, bool kAdd = false>
bool try_norm_fwd_warp(const NormFwdTensors& t, const op_checks::NormShape& s,
                       cudaStream_t stream) {
  const TensorView* r = kAdd ? t.r : nullptr;
  const TensorView* z = kAdd ? t.z : nullptr;
  if (!norm_warp_case({t.x, t.w, t.y, t.b, r, z}, s.c, kWarpRowMaxVecs)) return false;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    NormFwdWarpArgs<T> a{};
    a.x = static_cast<const T*>(t.x->data);
    a.w = static_cast<const T*>(t.w->data);
    a.b = t.b ? static_cast<const T*>(t.b->data) : nullptr;
    a.y = static_cast<T*>(t.y->data);
    a.mean = t.mean;
    a.rstd = t.rstd;
    a.rows = s.n, a.cols = s.c;
    a.eps = s.attrs.eps;
    a.gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
    if (kAdd) {
      a.r = static_cast<const T*>(r->data);
      a.z = static_cast<T*>(z->data);
    }
    launch_norm_fwd_warp<T, kRms, kAdd>(a, stream);
  };
  if (t.x->dtype == DType::kBF16)
    run(__nv_bfloat16{});
  else if (t.x->dtype == DType::kF16)
    run(__half{});
  else
    run(float{});
  return true;
}

// The general forward (norm_fwd_kernel) of X, any dtypes, widths and alignment; t.r and
// t.z are ignored (the residual-add forms' fallback passes Z as X).
template <bool kRms>
void launch_norm_fwd_general(const NormFwdTensors& t, const op_checks::NormShape& s,
                             cudaStream_t stream, const char* op) {
  NormFwdArgs a{};
  a.x = t.x->data, a.xt = t.x->dtype;
  a.w = t.w->data, a.wt = t.w->dtype;
  a.b = t.b ? t.b->data : nullptr, a.bt = t.b ? t.b->dtype : DType::kF32;
  a.y = t.y->data, a.yt = t.y->dtype;
  a.mean = t.mean;
  a.rstd = t.rstd;
  a.rows = s.n, a.cols = s.c;
  a.eps = s.attrs.eps;
  a.gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
  a.vec = s.c % 4 == 0 && aligned4(*t.x) && aligned4(*t.w) && aligned4(*t.y) &&
          (!t.b || aligned4(*t.b));
  RowGeometry g = norm_fwd_geometry(s.n, s.c);
  a.tpr = g.tpr;
  norm_fwd_kernel<kRms><<<g.grid, g.block, 0, stream>>>(a);
  launch_check(op);
}

template <bool kRms>
void launch_norm_fwd(const OpCall* call, const op_checks::NormShape& s, const char* op) {
  if (s.n == 0) return;
  const NormFwdTensors t = norm_fwd_tensors<kRms>(call);
  if (s.c > 0 && try_norm_fwd_warp<kRms>(t, s, stream_of(call))) {
    launch_check(op);
    return;
  }
  launch_norm_fwd_general<kRms>(t, s, stream_of(call), op);
}

// The tensors of a backward call (plain, or residual-add with dz), and its workspace.
struct NormBwdTensors {
  const TensorView* dy;  // (N, C)
  const TensorView* x;   // (N, C); Z for the residual-add forms
  const TensorView* w;   // (C)
  const float* mean;     // (N); null for RMSNorm
  const float* rstd;     // (N)
  const TensorView* dz;  // (N, C) added to dX, or null
  const TensorView* dx;  // (N, C)
  float* dw;             // (C) +=
  float* db;             // (C) += or null
  float* partial;        // the workspace (norm_bwd_workspace_bytes), or null: atomics
};

// The plain backward's tensors: dY, X, weight[, mean], rstd -> dX, dweight[, dbias]; the
// workspace when the call gives enough of it, 4-byte aligned.
template <bool kRms>
NormBwdTensors norm_bwd_tensors(const OpCall* call, const op_checks::NormShape& s) {
  NormBwdTensors t{};
  t.dy = &call->inputs[0];
  t.x = &call->inputs[1];
  t.w = &call->inputs[2];
  t.mean = kRms ? nullptr : static_cast<const float*>(call->inputs[3].data);
  t.rstd = static_cast<const float*>(call->inputs[kRms ? 3 : 4].data);
  t.dx = &call->outputs[0];
  t.dw = static_cast<float*>(call->outputs[1].data);
  t.db = kRms ? nullptr : static_cast<float*>(call->outputs[2].data);
  const uint64_t need = norm_bwd_workspace_bytes(s.n, s.c, t.db != nullptr ? 2 : 1);
  t.partial = call->workspace != nullptr && call->workspace_bytes >= need &&
                      reinterpret_cast<uintptr_t>(call->workspace) % alignof(float) == 0
                  ? static_cast<float*>(call->workspace)
                  : nullptr;
  return t;
}

// The warp-per-row backward (norm_warp.cuh) when the call is its case: dY, X, weight and dX
// (and dZ) all bf16, all f16 or all f32, C a multiple of 8 and at most 2048 (past 1024 the kernel
// reads X a second time rather than keep it in registers; the general kernel ran LLaMA
// 1.3B's C = 2048 at 0.11 ms, 909 GB/s, on an H200, against 1770 GB/s for this one at
// C = 768), every tensor 16-byte aligned, and the workspace for the weight gradients'
// partial rows (`partial`). kAdd (t.dz set) fuses dX += dZ, a template parameter
// as in the forward. False (nothing launched) otherwise.
template <bool kRms, bool kAdd = false>
bool try_norm_bwd_warp(const NormBwdTensors& t, const op_checks::NormShape& s, cudaStream_t stream,
                       const char* op) {
  const TensorView* dz = kAdd ? t.dz : nullptr;
  if (t.partial == nullptr || !norm_warp_case({t.dy, t.x, t.w, t.dx, dz}, s.c, kWarpRowMaxBwdVecs))
    return false;
  const int grads = t.db != nullptr ? 2 : 1;
  // Fused: a grid of norm_fused_blocks, one partial row each; separate: a block per 8 rows,
  // then the cols kernel's block rows.
  const bool fused = norm_bwd_fused();
  const int64_t blocks = fused ? norm_fused_blocks(s.n, multiprocessor_count(t.dx->device.index))
                               : (s.n + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
  const int64_t partial_rows = fused ? blocks : norm_wgrad_cols_slices(s.n, s.c);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    NormBwdWarpArgs<T> a{};
    a.dy = static_cast<const T*>(t.dy->data);
    a.x = static_cast<const T*>(t.x->data);
    a.dz = kAdd ? static_cast<const T*>(dz->data) : nullptr;
    a.w = static_cast<const T*>(t.w->data);
    a.mean = t.mean;
    a.rstd = t.rstd;
    a.dx = static_cast<T*>(t.dx->data);
    a.rows = s.n, a.cols = s.c;
    a.gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
    a.partial = t.partial;
    a.want_db = t.db != nullptr;
    const int vecs = static_cast<int>((s.c / 8 + 31) / 32);
    const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxGridBlocks));
    const int threads = kWarpRowsPerBlock * 32;
    auto launch = [&](auto vec_count) {
      constexpr int kVecs = decltype(vec_count)::value;
      if (fused)
        norm_bwd_warp_kernel<T, kRms, kVecs, kAdd, true><<<grid, threads, 0, stream>>>(a);
      else
        norm_bwd_warp_kernel<T, kRms, kVecs, kAdd, false><<<grid, threads, 0, stream>>>(a);
    };
    switch (vecs) {
      case 1:
        launch(std::integral_constant<int, 1>{});
        break;
      case 2:
        launch(std::integral_constant<int, 2>{});
        break;
      case 3:
        launch(std::integral_constant<int, 3>{});
        break;
      case 4:
        launch(std::integral_constant<int, 4>{});
        break;
      case 5:
      case 6:
        launch(std::integral_constant<int, 6>{});
        break;
      default:
        launch(std::integral_constant<int, 8>{});
        break;
    }
    launch_check(op);
    if (!fused) {
      const dim3 cols_grid(static_cast<unsigned>((s.c / 8 + 31) / 32),
                           static_cast<unsigned>(partial_rows));
      norm_wgrad_cols_kernel<T, kRms><<<cols_grid, 256, 0, stream>>>(a, a.want_db, t.partial);
      launch_check(op);
    }
  };
  if (t.x->dtype == DType::kBF16)
    run(__nv_bfloat16{});
  else if (t.x->dtype == DType::kF16)
    run(__half{});
  else
    run(float{});
  norm_wgrad_finalize_kernel<kRms>
      <<<dim3(static_cast<unsigned>((s.c + 31) / 32), grads), dim3(32, 32), 0, stream>>>(
          t.partial, partial_rows, grads, s.c, t.dw, t.db);
  launch_check(op);
  return true;
}

// The general backward (norm_bwd_kernel, then the finalize kernel with the workspace) into
// dX; t.dz is ignored (the residual-add forms' fallback adds it afterwards).
template <bool kRms>
void launch_norm_bwd_general(const NormBwdTensors& t, const op_checks::NormShape& s,
                             cudaStream_t stream, const char* op) {
  NormBwdArgs a{};
  a.dy = t.dy->data, a.dyt = t.dy->dtype;
  a.x = t.x->data, a.xt = t.x->dtype;
  a.w = t.w->data, a.wt = t.w->dtype;
  a.mean = t.mean;
  a.rstd = t.rstd;
  a.dx = t.dx->data, a.dxt = t.dx->dtype;
  a.dw = t.dw;
  a.db = t.db;
  a.partial = t.partial;
  a.rows = s.n, a.cols = s.c;
  a.gamma_shift = s.attrs.zero_centered_gamma ? 1.0f : 0.0f;
  a.vec = s.c % 4 == 0 && aligned4(*t.dy) && aligned4(*t.x) && aligned4(*t.w) && aligned4(*t.dx);
  const int grads = a.db != nullptr ? 2 : 1;
  RowGeometry g = norm_bwd_geometry(s.n, s.c);
  a.tpr = g.tpr;
  size_t smem = g.teams > 1 ? static_cast<size_t>(grads) * s.c * sizeof(float) : 0;
  norm_bwd_kernel<kRms><<<g.grid, g.block, smem, stream>>>(a);
  launch_check(op);
  if (a.partial != nullptr) {
    dim3 grid(static_cast<unsigned>((s.c + 31) / 32), grads);
    norm_wgrad_finalize_kernel<kRms>
        <<<grid, dim3(32, 32), 0, stream>>>(a.partial, g.grid, grads, s.c, a.dw, a.db);
    launch_check(op);
  }
}

template <bool kRms>
void launch_norm_bwd(const OpCall* call, const op_checks::NormShape& s, const char* op) {
  if (s.n == 0 || s.c == 0) return;
  const NormBwdTensors t = norm_bwd_tensors<kRms>(call, s);
  if (try_norm_bwd_warp<kRms>(t, s, stream_of(call), op)) return;
  launch_norm_bwd_general<kRms>(t, s, stream_of(call), op);
}

}  // namespace loom::kernels::cuda::pointwise
