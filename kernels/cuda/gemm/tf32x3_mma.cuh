// 3xTF32 with the split in registers: one GEMM kernel of loom's own on TF32 tensor cores
// (mma.sync m16n8k8) computes Y = alpha op(A) op(B) + beta Y (+ bias) at f32 accuracy, with
// no workspace and no split pass (the method and its error bound: tf32x3.cuh); its epilogue
// may go on to GELU or GELU's derivative (Tf32x3Activation: gemm_epilogue's kEpilogueGelu and
// kEpilogueDGelu, in f32, with gelu.cu's arithmetic).
//
// A block (4 warps, 2 x 2) owns a BM x BN tile of Y: 128 x 64 (each warp 64 x 32: 4 x 4 mma
// tiles) or 64 x 32 (each warp 32 x 16). Per stage it copies BK = 16 columns of K of its rows
// of A and its columns of B into shared memory as they are stored (cp.async, three buffers:
// the copies run two stages ahead of the mma), then each warp, per 8 columns of K, reads its
// fragments, splits every element x into x_hi and x_lo (split_tf32, the low half rounded to
// TF32 by tf32_low_half), sums
//   A_lo B_hi + A_hi B_lo + A_hi B_hi
// from zero (three mma per 16 x 8 tile, the small terms first) and adds that to its f32
// accumulators with a rounded f32 add. The tensor cores align an mma's addends and truncate
// its sum toward zero (Fasi et al., PeerJ CS 2021; measured on an H200, BENCHMARKS.md): with
// the accumulator itself as the mma's addend, every mma lost up to a unit of the
// accumulator's last place, always toward zero, and the H200 gave up to 1.7e-6 of sum |a b|,
// 3-16x cuBLAS's f32 on the same inputs. Summed from zero, an mma truncates only its own 8
// columns' sum. Every Y element is summed in the same order whatever the tile, so both tiles
// give the same bits.
//
// Shared memory holds each operand's stage as stored: rows of 16 floats of K (A stored (M, K),
// B stored (N, K)) padded to 20, or rows of BM (BN) floats along M (N) padded by 8. A warp's
// fragment reads then touch 32 banks once: (8 g + t) or (20 g + t) mod 32 over the lanes.
//
// A split contraction (plan_tf32x3_mma: too few tiles to fill the GPU, and K long) runs the
// same kernel over ranges of K into partial sums (alpha 1, beta 0, no bias), then
// tf32x3_partial_sum_kernel adds the ranges in order and applies alpha, beta, the bias and the
// activation.
//
// Device code that the emulation test compiles as host C++ (tests/kernels/cuda/gemm_emulation);
// include it in one .cu file only: it defines __global__ functions.
#pragma once

#include <stdint.h>

#include "kernels/cuda/gemm/tf32_mma.cuh"
#include "kernels/cuda/gemm/tf32x3.cuh"
#include "kernels/cuda/gemm/tf32x3_plan.h"
#include "kernels/cuda/pointwise/gelu_math.cuh"

namespace loom::kernels::cuda::gemm {

// One launch: `gridDim.z` = batches x ranges of K, blockIdx.z = batch index x ranges + range.
struct Tf32x3MmaParams {
  const float* a;     // op(A) (batch, M, K): stored (M, K), or (K, M) when transposed
  const float* b;     // op(B) ((batch,) K, N): stored (N, K) when transposed, else (K, N)
  float* y;           // (batch, M, N); partial sums: (ranges, batch, M, N)
  const float* bias;  // (N) or null
  int64_t m, n, k;
  int64_t stride_a, stride_b, stride_y;  // floats between batch matrices (stride_b 0: shared B)
  int64_t ranges, k_split;               // ranges of K, columns per range
  float alpha, beta;                     // beta 0 never reads Y
  Tf32x3Activation act;                  // aux and p at this launch's first batch matrix
};

// Y's element at offset `at` (of `act`'s aux and p too) from v = alpha acc + beta y + bias.
__device__ __forceinline__ float tf32x3_activate(const Tf32x3Activation& act, float v, int64_t at) {
  if (act.kind == Tf32x3Activation::kGelu) {
    if (act.aux != nullptr) act.aux[at] = v;
    return pointwise::gelu(v, act.tanh, nullptr);
  }
  if (act.kind == Tf32x3Activation::kDGelu) {
    float d;
    pointwise::gelu(act.p[at], act.tanh, &d);
    return v * d;
  }
  return v;
}

inline constexpr int kTf32x3MmaThreads = 128;
inline constexpr int kTf32x3BK = static_cast<int>(kTf32x3TileK);
// Stages of K in shared memory: copies run two stages ahead of the mma. The large tile's
// three take 45 KB (under the 48 KB of static shared memory).
inline constexpr int kTf32x3Stages = 3;

// One operand's stage in shared memory, ROWS x COLS of the stored matrix (COLS along its
// contiguous dimension), each row kStride floats (16-byte aligned starts; see the file comment).
template <int ROWS, int COLS>
struct StageTile {
  static constexpr int kStride = COLS + (COLS == kTf32x3BK ? 4 : 8);
  static constexpr int kFloats = ROWS * kStride;
};

// Copies rows [r0, r0 + ROWS) and columns [c0, c0 + COLS) of x (row-major, `ld` floats a row)
// into s, zeros outside rows < rows_end and columns < cols_end. kVec: 16 bytes a copy (x
// 16-byte aligned and ld, c0 and cols_end multiples of 4), else 4.
template <int ROWS, int COLS, bool kVec>
__device__ __forceinline__ void load_stage(float* s, const float* x, int64_t ld, int64_t rows_end,
                                           int64_t cols_end, int64_t r0, int64_t c0) {
  constexpr int kStride = StageTile<ROWS, COLS>::kStride;
  constexpr int kWidth = kVec ? 4 : 1;  // floats a copy
  constexpr int kPerRow = COLS / kWidth;
  constexpr int kCopies = ROWS * kPerRow;
  static_assert(kCopies % kTf32x3MmaThreads == 0, "a stage is whole copies per thread");
#pragma unroll
  for (int i = 0; i < kCopies / kTf32x3MmaThreads; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kTf32x3MmaThreads;
    const int r = c / kPerRow, col = (c % kPerRow) * kWidth;
    const int64_t gr = r0 + r, gc = c0 + col;
    const bool valid = gr < rows_end && gc < cols_end;
    const float* src = valid ? x + gr * ld + gc : x;
    if constexpr (kVec)
      cp_async_16(s + r * kStride + col, src, valid);
    else
      cp_async_4(s + r * kStride + col, src, valid);
  }
}

// Element (mn, k) of a stage: stored with K contiguous (rows along M or N) or not.
template <bool kKContiguous, int MN>
__device__ __forceinline__ float stage_at(const float* s, int mn, int k) {
  if constexpr (kKContiguous)
    return s[mn * StageTile<MN, kTf32x3BK>::kStride + k];
  else
    return s[k * StageTile<kTf32x3BK, MN>::kStride + mn];
}

// x's TF32 halves as mma operands: split_tf32's, the low half through tf32_low_half.
__device__ __forceinline__ void split_operand(float x, uint32_t* hi, uint32_t* lo) {
  float h, l;
  split_tf32(x, &h, &l);
  *hi = __float_as_uint(h);  // a TF32 value already
  *lo = __float_as_uint(tf32_low_half(l));
}

// MT x NT mma tiles (16 x 8) per warp: BM = 32 MT, BN = 16 NT.
template <int MT, int NT, bool kTransA, bool kTransB, bool kVec>
__global__ void __launch_bounds__(kTf32x3MmaThreads) tf32x3_mma_kernel(Tf32x3MmaParams p) {
  constexpr int BM = 32 * MT, BN = 16 * NT, BK = kTf32x3BK;
  constexpr bool kAK = !kTransA;  // A's stage has K contiguous: stored (M, K)
  constexpr bool kBK = kTransB;   // B's: stored (N, K)
  constexpr int kAFloats = kAK ? StageTile<BM, BK>::kFloats : StageTile<BK, BM>::kFloats;
  constexpr int kBFloats = kBK ? StageTile<BN, BK>::kFloats : StageTile<BK, BN>::kFloats;
  __shared__ __align__(16) float sa[kTf32x3Stages][kAFloats];
  __shared__ __align__(16) float sb[kTf32x3Stages][kBFloats];

  const int64_t z = blockIdx.z, range = z % p.ranges, bz = z / p.ranges;
  const float* a = p.a + bz * p.stride_a;
  const float* b = p.b + bz * p.stride_b;
  float* y = p.y + (range * (gridDim.z / p.ranges) + bz) * p.stride_y;
  const int64_t k_begin = range * p.k_split;
  const int64_t k_end = p.k - k_begin < p.k_split ? p.k : k_begin + p.k_split;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = (warp % 2) * 16 * MT, wn = (warp / 2) * 8 * NT;  // the warp's tile in the block's

  // Buffer `buf` <- columns [k0, k0 + BK) of K (zeros past k_end, M and N).
  auto load = [&](int buf, int64_t k0) {
    if constexpr (kAK)
      load_stage<BM, BK, kVec>(sa[buf], a, p.k, p.m, k_end, m0, k0);
    else
      load_stage<BK, BM, kVec>(sa[buf], a, p.m, k_end, p.m, k0, m0);
    if constexpr (kBK)
      load_stage<BN, BK, kVec>(sb[buf], b, p.k, p.n, k_end, n0, k0);
    else
      load_stage<BK, BN, kVec>(sb[buf], b, p.n, k_end, p.n, k0, n0);
  };

  float acc[MT][NT][4] = {};
  const int64_t stages = (k_end - k_begin + BK - 1) / BK;
  // The pipeline: stages 0 .. kTf32x3Stages - 2 in flight before the loop; each iteration waits for
  // its own stage, and after the barrier (which also says that every warp is done with the
  // previous stage's buffer) issues the copies of the stage kTf32x3Stages - 1 ahead into that
  // buffer. Every iteration commits one group, empty past the last stage, so that "all but
  // the newest kTf32x3Stages - 2 groups" is always this stage.
#pragma unroll
  for (int s = 0; s < kTf32x3Stages - 1; ++s) {
    if (s < stages) load(s, k_begin + s * BK);
    cp_async_commit();
  }
  for (int64_t st = 0; st < stages; ++st) {
    cp_async_wait_group<kTf32x3Stages - 2>();
    __syncthreads();
    const int64_t ahead = st + kTf32x3Stages - 1;
    if (ahead < stages) load(static_cast<int>(ahead % kTf32x3Stages), k_begin + ahead * BK);
    cp_async_commit();
    const int buf = static_cast<int>(st % kTf32x3Stages);
    const float* as = sa[buf];
    const float* bs = sb[buf];
#pragma unroll
    for (int ks = 0; ks < BK; ks += 8) {
      uint32_t a_hi[MT][4], a_lo[MT][4], b_hi[NT][2], b_lo[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = wm + i * 16 + g;
        split_operand(stage_at<kAK, BM>(as, r, ks + t), &a_hi[i][0], &a_lo[i][0]);
        split_operand(stage_at<kAK, BM>(as, r + 8, ks + t), &a_hi[i][1], &a_lo[i][1]);
        split_operand(stage_at<kAK, BM>(as, r, ks + t + 4), &a_hi[i][2], &a_lo[i][2]);
        split_operand(stage_at<kAK, BM>(as, r + 8, ks + t + 4), &a_hi[i][3], &a_lo[i][3]);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int c = wn + j * 8 + g;
        split_operand(stage_at<kBK, BN>(bs, c, ks + t), &b_hi[j][0], &b_lo[j][0]);
        split_operand(stage_at<kBK, BN>(bs, c, ks + t + 4), &b_hi[j][1], &b_lo[j][1]);
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          // The three products of these 8 columns summed from zero on the tensor cores, then
          // added to the accumulator in f32 (rounded): the tensor cores truncate each mma's
          // sum, so a chain of mma on one accumulator would lose up to a unit of its last
          // place per mma, all in one direction (see the header).
          float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_1688_tf32(part, a_lo[i], b_hi[j][0], b_hi[j][1]);
          mma_1688_tf32(part, a_hi[i], b_lo[j][0], b_lo[j][1]);
          mma_1688_tf32(part, a_hi[i], b_hi[j][0], b_hi[j][1]);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][e] += part[e];
        }
    }
  }
  cp_async_wait_group<0>();  // only empty groups are left; none may outlive the block

  // Y = alpha acc + beta Y + bias, as cuBLASLt's epilogue orders them; then the activation.
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t r = m0 + wm + i * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t c = n0 + wn + j * 8 + 2 * t + (e & 1);
        if (r >= p.m || c >= p.n) continue;
        float* out = y + r * p.n + c;
        float v = p.alpha * acc[i][j][e];
        if (p.beta != 0.0f) v += p.beta * *out;
        if (p.bias != nullptr) v += p.bias[c];
        *out = tf32x3_activate(p.act, v, bz * p.stride_y + r * p.n + c);
      }
}

// The ranges' partial sums (ranges, count) added in order: y[i] = act(alpha (p_0 + p_1 + ...)
// + beta y[i] (+ bias[i % n])) over the `count` elements of Y (batch x M x N).
struct Tf32x3PartialSumParams {
  const float* partial;
  float* y;
  const float* bias;
  int64_t count, n, ranges;
  float alpha, beta;
  Tf32x3Activation act;  // aux and p at y's first element
};

inline constexpr int kTf32x3SumThreads = 256;

__global__ void __launch_bounds__(kTf32x3SumThreads)
    tf32x3_partial_sum_kernel(Tf32x3PartialSumParams p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kTf32x3SumThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kTf32x3SumThreads + threadIdx.x; i < p.count;
       i += step) {
    float s = p.partial[i];
    for (int64_t r = 1; r < p.ranges; ++r) s += p.partial[r * p.count + i];
    float v = p.alpha * s;
    if (p.beta != 0.0f) v += p.beta * p.y[i];
    if (p.bias != nullptr) v += p.bias[i % p.n];
    p.y[i] = tf32x3_activate(p.act, v, i);
  }
}

// ---- The launches ----------------------------------------------------------------------------

using Tf32x3MmaKernel = void (*)(Tf32x3MmaParams);

template <int MT, int NT>
Tf32x3MmaKernel tf32x3_mma_kernel_of(bool trans_a, bool trans_b, bool vec) {
  if (vec) {
    if (trans_a)
      return trans_b ? tf32x3_mma_kernel<MT, NT, true, true, true>
                     : tf32x3_mma_kernel<MT, NT, true, false, true>;
    return trans_b ? tf32x3_mma_kernel<MT, NT, false, true, true>
                   : tf32x3_mma_kernel<MT, NT, false, false, true>;
  }
  if (trans_a)
    return trans_b ? tf32x3_mma_kernel<MT, NT, true, true, false>
                   : tf32x3_mma_kernel<MT, NT, true, false, false>;
  return trans_b ? tf32x3_mma_kernel<MT, NT, false, true, false>
                 : tf32x3_mma_kernel<MT, NT, false, false, false>;
}

// Whether A and B allow the 16-byte copies: both 16-byte aligned, and their contiguous
// dimensions (so every row and batch matrix) multiples of 4 floats.
inline bool tf32x3_mma_vec(const Tf32x3Shape& s, const float* A, const float* B) {
  const auto aligned = [](const float* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  return aligned(A) && aligned(B) && (s.trans_a ? s.m : s.k) % 4 == 0 &&
         (s.trans_b ? s.k : s.n) % 4 == 0;
}

// What a call launches: the kernel, its grid over one batch chunk, and its parameters.
struct Tf32x3MmaLaunch {
  Tf32x3MmaKernel kernel;
  unsigned grid_x, grid_y, grid_z;
  Tf32x3MmaParams params;
};

// Most batch matrices (x ranges) one launch covers: CUDA's limit on gridDim.z.
inline constexpr int64_t kTf32x3MaxGridZ = 65535;

// The launches of Y = act(alpha op(A) op(B) + beta Y (+ bias)) for `s` under `plan`, in order,
// through launch(const Tf32x3MmaLaunch&) and then, for a split contraction, sum(const
// Tf32x3PartialSumParams&) with the partial sums at `partial` (plan.splits x batch x M x N
// floats). A shared B that A's storage allows folds the batch into M. The caller has checked
// that K > 0, that the grid's x and y fit, and (kVec) the alignments: `vec` says whether A and
// B allow 16-byte copies.
template <class Launch, class Sum>
void tf32x3_mma_launches(const Tf32x3Shape& s, const Tf32x3MmaPlan& plan, const float* A,
                         const float* B, float* Y, float alpha, float beta, const float* bias,
                         const Tf32x3Activation& act, bool vec, float* partial, Launch&& launch,
                         Sum&& sum) {
  const bool fold = s.shared_b && !s.trans_a && s.batch > 1;  // A (batch M, K), Y (batch M, N)
  const int64_t batch = fold ? 1 : s.batch, m = fold ? s.batch * s.m : s.m;
  const int64_t bm = plan.large ? kTf32x3LargeTileM : kTf32x3SmallTileM;
  const int64_t bn = plan.large ? kTf32x3LargeTileN : kTf32x3SmallTileN;
  Tf32x3MmaLaunch l{};
  l.kernel = plan.large ? tf32x3_mma_kernel_of<4, 4>(s.trans_a, s.trans_b, vec)
                        : tf32x3_mma_kernel_of<2, 2>(s.trans_a, s.trans_b, vec);
  l.grid_x = static_cast<unsigned>(ceil_div(m, bm));
  l.grid_y = static_cast<unsigned>(ceil_div(s.n, bn));
  Tf32x3MmaParams& p = l.params;
  p.m = m;
  p.n = s.n;
  p.k = s.k;
  p.stride_a = m * s.k;
  p.stride_b = s.shared_b ? 0 : s.k * s.n;
  p.stride_y = m * s.n;
  p.ranges = plan.splits;
  p.k_split = plan.k_split;
  const bool split = plan.splits > 1;
  p.alpha = split ? 1.0f : alpha;
  p.beta = split ? 0.0f : beta;
  p.bias = split ? nullptr : bias;
  // Act's aux and p, `b0` batch matrices on (as Y).
  auto act_at = [&](int64_t b0) {
    Tf32x3Activation at = act;
    if (at.aux != nullptr) at.aux += b0 * p.stride_y;
    if (at.p != nullptr) at.p += b0 * p.stride_y;
    return at;
  };
  const int64_t per_launch = std::max<int64_t>(1, kTf32x3MaxGridZ / plan.splits);
  for (int64_t b0 = 0; b0 < batch; b0 += per_launch) {
    const int64_t count = std::min(per_launch, batch - b0);
    p.a = A + b0 * p.stride_a;
    p.b = B + b0 * p.stride_b;
    // Partial sums: range r of batch matrix b at (r batch + b) M N; the kernel finds it from
    // gridDim.z, so a chunk of the batch writes its own (ranges x count) block.
    p.y = split ? partial + b0 * plan.splits * p.stride_y : Y + b0 * p.stride_y;
    p.act = split ? Tf32x3Activation{} : act_at(b0);
    l.grid_z = static_cast<unsigned>(count * plan.splits);
    launch(l);
  }
  if (!split) return;
  // The partial sums of every chunk, as one (ranges, batch M N) array when there is one chunk.
  for (int64_t b0 = 0; b0 < batch; b0 += per_launch) {
    const int64_t count = std::min(per_launch, batch - b0);
    Tf32x3PartialSumParams q{};
    q.partial = partial + b0 * plan.splits * p.stride_y;
    q.y = Y + b0 * p.stride_y;
    q.bias = bias;
    q.count = count * p.stride_y;
    q.n = s.n;
    q.ranges = plan.splits;
    q.alpha = alpha;
    q.beta = beta;
    q.act = act_at(b0);
    sum(q);
  }
}

}  // namespace loom::kernels::cuda::gemm
