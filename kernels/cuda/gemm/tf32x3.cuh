// 3xTF32: an f32 GEMM on TF32 tensor cores at f32 accuracy (the "big + small" split of
// CUTLASS's 3xTF32 GEMMs; Ootomo and Yokota, "Recovering single precision accuracy from
// Tensor Cores while surpassing the FP32 theoretical peak performance", 2022).
//
// The split. Each f32 operand element x becomes x_hi, x rounded to TF32 (10 mantissa bits,
// ties away from zero, as cvt.rna.tf32.f32), and x_lo = x - x_hi, which is exact in f32 and
// at most half a TF32 unit of x (2^-11 |x|). Then
//   a . b = a_hi b_hi + a_hi b_lo + a_lo b_hi + a_lo b_lo
// and the GEMM computes the first three on TF32 tensor cores with f32 accumulation:
//   - a_hi b_hi is exact in f32 (11 x 11 significant bits);
//   - a_lo and b_lo are rounded to TF32 again (tf32_low_half: to nearest, ties to even, before
//     the tensor cores read them), an error of at most 2^-11 |a_lo| <= 2^-22 |a| in each
//     cross term (2^-10 |a_lo| were it truncated);
//   - the dropped a_lo b_lo is at most 2^-22 |a||b|.
// So each product is off by at most about 2^-20 |a||b|, against the f32 accumulation's own
// rounding of up to 2^-24 per addition over K terms: f32 accuracy for any K worth a GEMM,
// where one TF32 product is off by up to 2^-10. Infinities and NaN keep x_hi = x, x_lo = 0;
// an x whose rounding would overflow to infinity is truncated instead.
//
// The layout. One chunk of the contraction, k in [k0, k0 + kc), padded to kp (kc rounded up
// to a multiple of 4 so that every row starts 16-byte aligned) with zeros, is written in one
// of two forms (tf32x3_plan.h's tf32x3_segments chooses per call, LOOM_TF32X3 forces one).
// Two segments:
//   A2 (rows_a, 2 kp) row-major = [A_hi | A_lo]   rows_a: loom's batch * M rows of A
//   B2 (rows_b, 2 kp) row-major = [B_lo | B_hi]   rows_b: N rows of B per batch matrix
// and two TF32 GEMMs, contracting over the row (a "TN" GEMM in cuBLAS's terms), add the
// chunk's three terms to Y:
//   1. over all 2 kp columns of both: A_hi B_lo^T + A_lo B_hi^T (the small terms first);
//   2. over A2's first kp columns and B2's last kp (leading dimension 2 kp): A_hi B_hi^T.
// Three segments: A2 = [A_hi | A_lo | A_hi], B2 = [B_lo | B_hi | B_hi], and one GEMM over all
// 3 kp columns adds the three terms. It writes a third more of the split, and saves the
// second GEMM's launch and its second pass over Y.
// Zero padding adds zeros. K longer than the workspace holds runs as several chunks; the
// first chunk's first GEMM applies the call's beta, every later GEMM adds (beta 1).
//
// That is the split form (LOOM_TF32X3=split|one|two). The default form splits in registers
// instead, inside loom's own GEMM kernel, with the same split_tf32 and the same three terms
// (tf32x3_mma.cuh): no workspace, no split pass.
//
// This header holds split_tf32, the split kernel (device code that the emulation test also
// compiles as host C++) and the order of its launches; tf32x3_plan.h the chunks;
// gemm_tf32x3.cu drives cuBLASLt. Include it in one .cu file only: it defines a __global__
// function.
#pragma once

#include <stdint.h>

#include <cstddef>

#include "kernels/cuda/gemm/tf32x3_plan.h"

namespace loom::kernels::cuda::gemm {

// ---- The split ----------------------------------------------------------------------------

// x = *hi + *lo, *hi rounded to TF32 (ties away from zero), *lo exact (see the file comment).
__device__ __forceinline__ void split_tf32(float x, float* hi, float* lo) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {  // infinity or NaN: no low part
    *hi = x;
    *lo = 0.0f;
    return;
  }
  uint32_t r = (u + 0x1000u) & 0xffffe000u;  // magnitude rounded at mantissa bit 13
  if ((r & 0x7f800000u) == 0x7f800000u) r = u & 0xffffe000u;  // overflowed: truncate
  *hi = __uint_as_float(r);
  *lo = x - *hi;  // exact: x and x_hi share sign and binade up to one TF32 unit
}

// A low half (split_tf32's *lo) rounded to TF32, ties to even, so that what the tensor cores
// read is a TF32 value whatever they do with an f32's low 13 bits (undocumented). A low half
// has at most 13 significant bits, so about a quarter of them are ties; rounding those away
// from zero would bias every small product the same way, and the bias adds up over K. Errs by
// at most 2^-11 |lo| <= 2^-22 |x|, within the bound above. A low half is far from overflow.
__device__ __forceinline__ float tf32_low_half(float lo) {
  const uint32_t u = __float_as_uint(lo);
  return __uint_as_float((u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u);
}

// One operand's side of a split launch: `batches` matrices stored (rows, k) row-major, or
// (k, rows) when k_major, from which columns [k0, k0 + kc) become rows of `out` (batches *
// rows, segments * kp): segment i holds the hi parts where bit i of hi_mask is set, the lo
// parts elsewhere.
struct SplitSide {
  const float* x;
  float* out;
  int64_t batches, rows, k;
  bool k_major;
  int segments;
  unsigned hi_mask;
};

inline constexpr int kSplitTile = 32;  // a block's tile: 32 rows x 32 columns of one matrix
inline constexpr int kSplitRowsPerPass = 8;
inline constexpr int kSplitThreads = kSplitTile * kSplitRowsPerPass;  // blockDim.x

// The launch: sides[0] is loom's A (tiles [0, tiles0)), sides[1] loom's B (the rest).
struct SplitParams {
  SplitSide sides[2];
  int64_t k0, kc, kp;
  int64_t tiles0;  // blocks of side 0
};

// Tiles of a side (one block each): batches * ceil(rows / 32) * ceil(kp / 32).
__host__ __device__ inline int64_t split_tiles(const SplitSide& s, int64_t kp) {
  return s.batches * ((s.rows + kSplitTile - 1) / kSplitTile) *
         ((kp + kSplitTile - 1) / kSplitTile);
}

// Each block reads a 32 x 32 tile of its matrix along its contiguous dimension (rows of a
// k-major operand, columns otherwise), through shared memory, and writes the tile's hi and
// lo rows of `out` along the columns: both coalesced. Columns kc .. kp - 1 are written as 0.
__global__ void __launch_bounds__(kSplitThreads) tf32x3_split_kernel(SplitParams p) {
  __shared__ float tile[kSplitTile][kSplitTile + 1];  // [row][column], padded: no bank conflicts
  int64_t t = blockIdx.x;
  const int side_index = t < p.tiles0 ? 0 : 1;
  const SplitSide s = side_index == 0 ? p.sides[0] : p.sides[1];  // no dynamic index: no stack
  if (side_index == 1) t -= p.tiles0;
  const int64_t tiles_j = (p.kp + kSplitTile - 1) / kSplitTile;
  const int64_t tiles_r = (s.rows + kSplitTile - 1) / kSplitTile;
  const int64_t tj = t % tiles_j, tr = (t / tiles_j) % tiles_r, b = t / (tiles_j * tiles_r);
  const int64_t r0 = tr * kSplitTile, j0 = tj * kSplitTile;
  const int lane = static_cast<int>(threadIdx.x) % kSplitTile;
  const int row = static_cast<int>(threadIdx.x) / kSplitTile;
  const float* x = s.x + b * s.rows * s.k;
  // Load: tile[i][lane-ish] = x at (r0 + i, k0 + j0 + jj) for the tile's rows i and columns jj.
  for (int i = row; i < kSplitTile; i += kSplitRowsPerPass) {
    if (s.k_major) {  // stored (k, rows): a column index i, lanes along rows
      const int64_t j = j0 + i, r = r0 + lane;
      tile[lane][i] = j < p.kc && r < s.rows ? x[(p.k0 + j) * s.rows + r] : 0.0f;
    } else {  // stored (rows, k): a row index i, lanes along the columns
      const int64_t j = j0 + lane, r = r0 + i;
      tile[i][lane] = j < p.kc && r < s.rows ? x[r * s.k + p.k0 + j] : 0.0f;
    }
  }
  __syncthreads();
  // Store: row r0 + i of out, column j0 + lane of each segment.
  const int64_t width = s.segments * p.kp;
  for (int i = row; i < kSplitTile; i += kSplitRowsPerPass) {
    const int64_t r = r0 + i, j = j0 + lane;
    if (r >= s.rows || j >= p.kp) continue;
    float hi, lo;
    split_tf32(tile[i][lane], &hi, &lo);
    lo = tf32_low_half(lo);
    float* out = s.out + (b * s.rows + r) * width + j;
    for (int seg = 0; seg < s.segments; ++seg) out[seg * p.kp] = (s.hi_mask >> seg) & 1u ? hi : lo;
  }
}

// The split launch of `chunk` for loom's A and B at a and b, into A2 at a2 and B2 at b2.
inline SplitParams split_params(const Tf32x3Shape& s, const Tf32x3Chunk& chunk, const float* a,
                                const float* b, float* a2, float* b2) {
  SplitParams p{};
  // A2 = [hi | lo] or [hi | lo | hi], B2 = [lo | hi] or [lo | hi | hi] (bit i: segment i).
  const bool three = s.segments == 3;
  p.sides[0] = SplitSide{a, a2, s.batch, s.m, s.k, s.trans_a, s.segments, three ? 0b101u : 0b01u};
  p.sides[1] = SplitSide{b,          b2,         s.shared_b ? 1 : s.batch, s.n, s.k,
                         !s.trans_b, s.segments, three ? 0b110u : 0b10u};
  p.k0 = chunk.k0;
  p.kc = chunk.kc;
  p.kp = chunk.kp;
  p.tiles0 = split_tiles(p.sides[0], chunk.kp);
  return p;
}

// One TF32 matmul of a chunk, in loom's row-major terms: for each batch index,
//   Y (M, N) = alpha * A2 (M, k) . B2 (N, k)^T + beta * Y (+ the call's bias when `bias`)
// where the rows of A2 and B2 are `ld` floats apart; A2 holds batch * M rows, B2 N rows (a
// shared B) or batch * N.
struct Tf32Matmul {
  const float* a2;
  const float* b2;
  int64_t k, ld;
  float beta;
  bool bias;
};

// The method's launches for the call Y = alpha op(A) op(B) + beta Y (+ bias) planned in
// `plan`, with A2 at `a2` and B2 at `b2`: split(SplitParams) and then matmul(Tf32Matmul)
// twice per chunk, in order (the driver issues them on one stream; the emulation test runs
// them on the CPU).
template <class Split, class Matmul>
void tf32x3_steps(const Tf32x3Shape& s, const Tf32x3Plan& plan, const float* a, const float* b,
                  float* a2, float* b2, float beta, bool bias, Split&& split, Matmul&& matmul) {
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const Tf32x3Chunk& chunk = plan.chunks[c];
    split(split_params(s, chunk, a, b, a2, b2));
    const bool last = c + 1 == plan.chunks.size();
    const float first_beta = c == 0 ? beta : 1.0f;  // the call's beta in the first chunk
    if (s.segments == 3) {  // all three terms in one matmul over 3 kp columns
      matmul(Tf32Matmul{a2, b2, 3 * chunk.kp, 3 * chunk.kp, first_beta, last && bias});
      continue;
    }
    // 1: A_hi B_lo + A_lo B_hi over all 2 kp columns.
    matmul(Tf32Matmul{a2, b2, 2 * chunk.kp, 2 * chunk.kp, first_beta, false});
    // 2: A_hi B_hi, added: A2's first kp columns, B2's last kp.
    matmul(Tf32Matmul{a2, b2 + chunk.kp, chunk.kp, 2 * chunk.kp, 1.0f, last && bias});
  }
}

}  // namespace loom::kernels::cuda::gemm
