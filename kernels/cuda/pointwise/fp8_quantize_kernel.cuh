// Device code of fp8_quantize (fp8_quantize.cu has the op's contract and the launches) and of
// swiglu_fp8_fwd / swiglu_fp8_bwd (swiglu_fp8.cu), and the host-side choice between the
// kernels (fp8_quantize_plan, swiglu_fp8_plan), in a header so that
// tests/kernels/cuda/pointwise_emulation runs every kernel on the CPU.
//
// Y = fp8(X * scale[0]) and its transpose Yt, each optional, and amax[0] = max(amax[0],
// max |X|) (of X before scaling, NaN propagating), for X (M, K) in any float dtype and Y / Yt
// in E4M3 or E5M2.
//
// Conversion: the f32 product X * scale[0], then loom/cpp/fp8.h's f32_to_fp8 bit for bit.
// cvt.rn.satfinite (cuda_fp8.h's __nv_cvt_float2_to_fp8x2 with __NV_SATFINITE, sm_89+, two
// values an instruction) rounds to nearest even and saturates; the input is clamped to +-max
// first so that infinities saturate whatever the instruction does with them, and NaN is
// encoded by hand: the instruction writes one canonical NaN (0x7f), f32_to_fp8 keeps the sign
// (S.1111.111 for E4M3, S.11111.10 for E5M2). The GPU's multiply already returns its canonical
// (positive) NaN, so a NaN in X gives the positive NaN code, where a CPU that propagates the
// operand's NaN may give the negative one: both are NaN. Every kernel below converts with the
// same function (fp8_codes), so they give the same bits.
//
// - quantize_kernel (Y only): one flat pass, a thread per chunk of 4 elements (a 16- or 8-byte
//   load, a 4-byte store when X and Y are aligned), grid-striding with 64-bit indices over at
//   most kFp8MaxBlocks blocks (about one wave of an H100, which saturates memory; it also bounds
//   the amax atomics of a call).
// - quantize_transpose_kernel (Yt, and Y when asked; any dtype, any alignment): each of at most
//   kFp8MaxBlocks blocks takes 64 x 64 tiles of X in turn. Phase 1 reads the tile by rows (16
//   threads per row, 4 elements each, pointwise/device_util.cuh's load4 with the dtype chosen
//   at run time), writes Y's codes straight to global memory and puts them in shared memory
//   already transposed, tile[k][m]; phase 2 writes Yt's 64 rows of the tile, 16 codes (one
//   16-byte store when M is a multiple of 16 and Yt aligned) per thread. A shared row is 68
//   bytes: the column writes of phase 1 and the word reads of phase 2 then meet at most 2-way
//   bank conflicts.
// - quantize_transpose_typed_kernel<T> (the same tiles and phases, X's storage type T known at
//   compile time): every thread loads its 2 (bf16, f16) or 4 (f32) 16-byte chunks of the tile
//   before it converts any, and loads the chunks of its block's next tile between phase 1 and
//   phase 2, so that they are in flight while phase 2 stores. The general kernel has one 8-byte
//   load of a thread in flight at a time (the run-time dtype switch keeps the compiler from
//   hoisting the next one), which kept it at about 2.1 TB/s of an H200's 4.8 (BENCHMARKS.md,
//   LLaMA 1.3B FP8). The plan takes it when X is 16-byte aligned with K a multiple of the
//   chunk (8 bf16 / f16, 4 f32), Y (when asked) aligned to a chunk's codes, and Yt 16-byte
//   aligned with M a multiple of 16: every chunk of the tile is then whole or wholly outside X.
//   Its loop is quantize_tiles, over a "source" of chunks (PlainSource: X itself).
// - swiglu_fp8_kernel<T, kBwd, kVec> (swiglu_fp8_fwd / _bwd): quantize_tiles over
//   SwigluSource, which loads a chunk's gate, up (and dY) and computes swiglu (or its two
//   gradients, as two outputs of one tile) with swiglu_kernel.cuh's expressions, rounded to
//   T as swiglu's kernels store it: the bits of swiglu then fp8_quantize. kVec false (any
//   alignment, F not a multiple of the chunk, N % 16 != 0) loads and stores element by
//   element.
//
// amax: each thread keeps an unsigned max over the bits of |x| over everything it read; the
// block folds it into amax[0] once, at the end (kernels/cuda/common/amax.cuh, the same as the
// "amax" op). scale_inv (the ops' optional output [3]): 1 / scale, written by thread 0 of
// block 0 before its loop (write_scale_inv); an empty call launches quantize_kernel with
// n = 0 for it alone.
//
// Plain CUDA C++ without host-only code in the kernels.
#pragma once

#include <cuda_fp8.h>
#include <loom/kernel.h>
#include <stdint.h>

#include <algorithm>

#include "kernels/cuda/common/amax.cuh"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {

inline constexpr int kFp8Tile = 64;                   // rows (M) and columns (K) of X per tile
inline constexpr int kFp8TileThreads = 4 * kFp8Tile;  // phase 2: 4 threads per row of Yt's tile
inline constexpr int kFp8TileStride = kFp8Tile + 4;   // bytes per shared row (file comment)
inline constexpr int64_t kFp8MaxBlocks = 1024;        // per launch (file comment)

// ---- Conversion -------------------------------------------------------------------------------

// The codes of v0 and v1 in E5M2 (kE5M2) or E4M3, exactly as loom's f32_to_fp8, in the low
// and the next byte.
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8_codes(float v0, float v1) {
  constexpr float kMax = kE5M2 ? 57344.0f : 448.0f;
  constexpr uint32_t kNan = kE5M2 ? 0x7eu : 0x7fu;
  const float2 c = make_float2(fminf(fmaxf(v0, -kMax), kMax), fminf(fmaxf(v1, -kMax), kMax));
  uint32_t codes = __nv_cvt_float2_to_fp8x2(c, __NV_SATFINITE, kE5M2 ? __NV_E5M2 : __NV_E4M3);
  if (isnan(v0)) codes = (codes & 0xff00u) | ((__float_as_uint(v0) >> 24) & 0x80u) | kNan;
  if (isnan(v1)) codes = (codes & 0x00ffu) | (((__float_as_uint(v1) >> 24) & 0x80u) | kNan) << 8;
  return codes;
}

// code[e] = the code of v[e] * s, and the bits of |v[e]| folded into `bits`; N even.
template <bool kE5M2, int N>
__device__ __forceinline__ void quantize_n(const float (&v)[N], float s, uint32_t (&code)[N],
                                           uint32_t& bits) {
  static_assert(N % 2 == 0);
#pragma unroll
  for (int e = 0; e < N; e += 2) {
    bits = max(bits, max(abs_bits(v[e]), abs_bits(v[e + 1])));
    const uint32_t two = fp8_codes<kE5M2>(v[e] * s, v[e + 1] * s);
    code[e] = two & 0xffu;
    code[e + 1] = two >> 8;
  }
}

// Stores the codes of elements i .. i + 3 below `end` at p + i; one 4-byte store when `vec`
// (p aligned to 4 bytes, i a multiple of 4) and the chunk is whole.
__device__ __forceinline__ void store_codes(uint8_t* p, int64_t i, int64_t end, bool vec,
                                            const uint32_t (&code)[4]) {
  if (vec && i + 4 <= end) {
    *reinterpret_cast<uint32_t*>(p + i) = code[0] | code[1] << 8 | code[2] << 16 | code[3] << 24;
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (i + e < end) p[i + e] = static_cast<uint8_t>(code[e]);
}

// scale_inv[0] = 1 / s, by one thread of the grid, when scale_inv is not null: the f32
// division fp8_scale_update writes its scale_inv with (kernels/cuda/optim/fp8_scale_update.cu),
// so the two give the same bits.
__device__ __forceinline__ void write_scale_inv(float s, float* __restrict__ scale_inv) {
  if (scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
}

// ---- The general kernels ------------------------------------------------------------------------

// Y only: X and Y flat, n elements (0: scale_inv alone). amax and scale_inv may be null.
template <bool kE5M2>
__global__ void quantize_kernel(const void* __restrict__ x, DType xt,
                                const float* __restrict__ scale, uint8_t* __restrict__ y,
                                float* __restrict__ amax, float* __restrict__ scale_inv, int64_t n,
                                bool vec) {
  const float s = *scale;
  write_scale_inv(s, scale_inv);
  uint32_t bits = 0u;
  const int64_t chunks = (n + 3) / 4;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < chunks;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = q * 4;
    float v[4];
    uint32_t code[4];
    load4(x, xt, i, n, vec, v);  // past n: zeros, which leave bits unchanged
    quantize_n<kE5M2>(v, s, code, bits);
    store_codes(y, i, n, vec, code);
  }
  if (amax != nullptr) block_amax_fold(bits, amax);
}

// Phase 2 of both transpose kernels: row k0 + c of Yt, columns m0 + 16 p .. m0 + 16 p + 15 from
// tile[c * kFp8TileStride + r] (the code of X[m0 + r, k0 + c]), c = threadIdx.x / 4,
// p = threadIdx.x % 4. vec_yt: Yt aligned to 16 bytes and M % 16 == 0.
__device__ __forceinline__ void store_yt_tile(const uint8_t* tile, uint8_t* __restrict__ yt,
                                              int64_t m, int64_t k, int64_t m0, int64_t k0,
                                              bool vec_yt) {
  const int c = threadIdx.x / 4, p = threadIdx.x % 4;
  const int64_t kr = k0 + c, mc = m0 + p * 16;
  if (kr >= k || mc >= m) return;
  const uint8_t* src = tile + c * kFp8TileStride + p * 16;
  uint8_t* dst = yt + kr * m + mc;
  if (vec_yt && mc + 16 <= m) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(src);
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    for (int e = 0; e < 16 && mc + e < m; ++e) dst[e] = src[e];
  }
}

// X (M, K) -> Yt (K, M) and, when y is not null, Y (M, K); amax and scale_inv may be null. vec_x: X
// aligned to 4 elements and K % 4 == 0; vec_y: Y aligned to 4 bytes and K % 4 == 0; vec_yt: Yt
// aligned to 16 bytes and M % 16 == 0.
template <bool kE5M2>
__global__ void __launch_bounds__(kFp8TileThreads)
    quantize_transpose_kernel(const void* __restrict__ x, DType xt, const float* __restrict__ scale,
                              uint8_t* __restrict__ y, uint8_t* __restrict__ yt,
                              float* __restrict__ amax, float* __restrict__ scale_inv, int64_t m,
                              int64_t k, bool vec_x, bool vec_y, bool vec_yt) {
  constexpr int kChunksPerRow = kFp8Tile / 4;
  // tile[c * kFp8TileStride + r]: the code of X[m0 + r, k0 + c].
  __shared__ __align__(16) uint8_t tile[kFp8Tile * kFp8TileStride];
  const float s = *scale;
  write_scale_inv(s, scale_inv);
  const int64_t tiles_k = (k + kFp8Tile - 1) / kFp8Tile;
  const int64_t tiles = tiles_k * ((m + kFp8Tile - 1) / kFp8Tile);
  uint32_t bits = 0u;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t m0 = (t / tiles_k) * kFp8Tile, k0 = (t % tiles_k) * kFp8Tile;
    // Phase 1: rows of X -> Y and the transposed tile.
    for (int c = threadIdx.x; c < kFp8Tile * kChunksPerRow; c += kFp8TileThreads) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 4;
      const int64_t row = m0 + r, kc = k0 + col;
      uint32_t code[4] = {0u, 0u, 0u, 0u};
      if (row < m && kc < k) {
        const int64_t i = row * k + kc, row_end = row * k + k;
        float v[4];
        load4(x, xt, i, row_end, vec_x, v);
        quantize_n<kE5M2>(v, s, code, bits);
        if (y != nullptr) store_codes(y, i, row_end, vec_y, code);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e)
        tile[(col + e) * kFp8TileStride + r] = static_cast<uint8_t>(code[e]);
    }
    __syncthreads();
    store_yt_tile(tile, yt, m, k, m0, k0, vec_yt);
    __syncthreads();  // the next tile overwrites `tile`
  }
  if (amax != nullptr) block_amax_fold(bits, amax);
}

// ---- The typed kernel
// -----------------------------------------------------------------------------

// Elements of X in one 16-byte chunk.
template <class T>
inline constexpr int kFp8Width = static_cast<int>(16 / sizeof(T));

// Blocks of the typed kernel a multiprocessor keeps resident (its __launch_bounds__ minimum),
// for X's element size: 6 for bf16 / f16 (40 registers, no spills on sm_90), 4 for f32 (64
// registers; at 40 its 4 chunks a thread spill). The plan launches that many a multiprocessor,
// one wave: a second, partial wave of blocks would leave multiprocessors idle at the end.
constexpr int fp8_typed_blocks_per_sm(size_t elem) { return elem == 4 ? 4 : 6; }

template <class T>
struct QuantizeTransposeArgs {
  const T* x;          // (M, K), 16-byte aligned, K % kFp8Width<T> == 0
  const float* scale;  // (1)
  uint8_t* y;          // (M, K) or null; aligned to kFp8Width<T> bytes
  uint8_t* yt;         // (K, M), 16-byte aligned, M % 16 == 0
  float* amax;         // (1) or null
  float* scale_inv;    // (1) or null
  int64_t m, k;
};

// The codes of W consecutive elements, one store (W = 4 or 8 bytes, p aligned to W).
template <int W>
__device__ __forceinline__ void store_chunk_codes(uint8_t* p, const uint32_t (&code)[W]) {
  uint32_t w[W / 4];
#pragma unroll
  for (int q = 0; q < W / 4; ++q)
    w[q] = code[4 * q] | code[4 * q + 1] << 8 | code[4 * q + 2] << 16 | code[4 * q + 3] << 24;
  if constexpr (W == 8)
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  else
    *reinterpret_cast<uint32_t*>(p) = w[0];
}

// ---- The tile loop of the typed kernel and of the fused swiglu kernels ----------------------

// A source of quantize_tiles: the values of a result of kOut * Kc columns and M rows, read as
// chunks of kW consecutive columns of one row: chunk (row, col), col a multiple of kW in
// [0, Kc), holds columns col + o * Kc of the result for o < kOut.
//   Raw                        the chunk's loads, kept in registers until it is converted
//   load(row, col, raw)        issues them (row < M, col < Kc; with kVec false, elements
//                              at or past Kc are zeros)
//   values(raw, v)             v[o][e]: the result at (row, col + o * Kc + e), in f32
//   kBanded                    true: the source keeps a table of the 64 rows of a tile (a band)
//                              in shared memory, which values reads:
//   band(m0, m)                (kBanded only) fills it for rows m0 .. m0 + 63 (those below M),
//                              called by every thread of the block; quantize_tiles calls it
//                              when a tile's rows differ from the last tile's, with a barrier
//                              before and after, and gives each block a contiguous run of
//                              tiles in row-major order so that most tiles share the last
//                              one's band (rope_fp8_kernel.cuh: the rotation's cos and sin)
// A chunk outside the result is Raw{} (zeros), whose values must be 0.

// fp8_quantize: X (M, K) of storage type T itself, 16-byte chunks, aligned (kVec).
template <class T>
struct PlainSource {
  static constexpr int kW = kFp8Width<T>;
  static constexpr int kOut = 1;
  static constexpr bool kVec = true;
  static constexpr bool kBanded = false;
  struct Raw {
    Pack<T, kW> x;
  };
  const T* x;
  int64_t k;
  __device__ __forceinline__ void load(int64_t row, int64_t col, Raw& r) const {
    r.x = *reinterpret_cast<const Pack<T, kW>*>(x + row * k + col);
  }
  __device__ __forceinline__ void values(const Raw& r, float (&v)[kOut][kW]) const {
#pragma unroll
    for (int e = 0; e < kW; ++e) v[0][e] = to_f32<T>(r.x.v[e]);
  }
};

// Quantises the result `src` describes, (M, kOut * Kc), with scale[0]: its codes into Y
// (M, kOut * Kc) unless y is null, their transpose into Yt (kOut * Kc, M), and the bits of
// |value| folded into amax unless it is null (1 / scale into scale_inv likewise). The typed
// kernel's tiles and phases (64 x 64 tiles of chunks, each of the kOut outputs through its own
// shared tile), the next tile's loads issued before this one's Yt rows are stored. A block takes
// every gridDim.x-th tile from blockIdx.x on, or with Src::kBanded a contiguous run of them (one
// gridDim.x-th of the tiles). y and yt may be null (not both: one of them is the point). With
// Src::kVec: Y aligned to a chunk's codes, Kc a multiple of kW, Yt 16-byte aligned and M % 16 == 0;
// without, any of them.
template <class Src, bool kE5M2>
__device__ __forceinline__ void quantize_tiles(const Src& src, const float* __restrict__ scale,
                                               uint8_t* __restrict__ y, uint8_t* __restrict__ yt,
                                               float* __restrict__ amax,
                                               float* __restrict__ scale_inv, int64_t m,
                                               int64_t kc) {
  constexpr int kW = Src::kW, kOut = Src::kOut;
  constexpr int kRowChunks = kFp8Tile / kW;                      // chunks a tile row
  constexpr int kPer = kFp8Tile * kRowChunks / kFp8TileThreads;  // a thread's: 2 bf16, 4 f32
  static_assert(kPer * kFp8TileThreads == kFp8Tile * kRowChunks);
  // tile[o][c * kFp8TileStride + r]: the code of output o's (m0 + r, k0 + c).
  __shared__ __align__(16) uint8_t tile[kOut][kFp8Tile * kFp8TileStride];
  const float s = *scale;
  write_scale_inv(s, scale_inv);
  const int64_t ktot = kOut * kc;  // Y's row length
  const int64_t tiles_k = (kc + kFp8Tile - 1) / kFp8Tile;
  const int64_t tiles = tiles_k * ((m + kFp8Tile - 1) / kFp8Tile);
  // Chunk j of this thread in a tile: row (c / kRowChunks), columns (c % kRowChunks) * kW on,
  // c = threadIdx.x + j * kFp8TileThreads. Outside the result it holds zeros.
  typename Src::Raw raw[kPer];
  auto load_tile = [&](int64_t t) {
    const int64_t m0 = (t / tiles_k) * kFp8Tile, k0 = (t % tiles_k) * kFp8Tile;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kFp8TileThreads;
      const int64_t row = m0 + c / kRowChunks, col = k0 + (c % kRowChunks) * kW;
      if (row < m && col < kc)
        src.load(row, col, raw[j]);
      else
        raw[j] = typename Src::Raw{};
    }
  };
  uint32_t bits = 0u;
  int64_t t = blockIdx.x, end = tiles, step = gridDim.x;
  if constexpr (Src::kBanded) {
    t = tiles * blockIdx.x / gridDim.x;
    end = tiles * (blockIdx.x + 1) / gridDim.x;
    step = 1;
  }
  int64_t band = -1;  // the rows (m0) of the source's table
  if (t < end) load_tile(t);
  for (; t < end; t += step) {
    const int64_t m0 = (t / tiles_k) * kFp8Tile, k0 = (t % tiles_k) * kFp8Tile;
    if constexpr (Src::kBanded) {
      if (m0 != band) {  // the same for the whole block; the last tile's reads are done
        src.band(m0, m);
        __syncthreads();
        band = m0;
      }
    }
    // Phase 1: the loaded chunks -> Y and the transposed tiles.
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kFp8TileThreads;
      const int r = c / kRowChunks, col = (c % kRowChunks) * kW;
      const int64_t row = m0 + r, kcol = k0 + col;
      float v[kOut][kW];
      src.values(raw[j], v);
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
        uint32_t code[kW];
        quantize_n<kE5M2>(v[o], s, code, bits);
        if (y != nullptr && row < m && kcol < kc) {
          uint8_t* out = y + row * ktot + o * kc + kcol;
          if constexpr (Src::kVec) {
            store_chunk_codes<kW>(out, code);
          } else {
#pragma unroll
            for (int e = 0; e < kW; ++e)
              if (kcol + e < kc) out[e] = static_cast<uint8_t>(code[e]);
          }
        }
#pragma unroll
        for (int e = 0; e < kW; ++e)
          tile[o][(col + e) * kFp8TileStride + r] = static_cast<uint8_t>(code[e]);
      }
    }
    __syncthreads();
    // The next tile's loads, in flight while this one's Yt rows are stored.
    if (t + step < end) load_tile(t + step);
    if (yt != nullptr) {
#pragma unroll
      for (int o = 0; o < kOut; ++o)
        store_yt_tile(tile[o], yt + o * kc * m, m, kc, m0, k0, Src::kVec);
    }
    __syncthreads();  // the next tile overwrites `tile` (and a kBanded source its table)
  }
  if (amax != nullptr) block_amax_fold(bits, amax);
}

template <class T, bool kE5M2>
__global__ void __launch_bounds__(kFp8TileThreads, fp8_typed_blocks_per_sm(sizeof(T)))
    quantize_transpose_typed_kernel(QuantizeTransposeArgs<T> a) {
  quantize_tiles<PlainSource<T>, kE5M2>(PlainSource<T>{a.x, a.k}, a.scale, a.y, a.yt, a.amax,
                                        a.scale_inv, a.m, a.k);
}

// ---- swiglu_fp8_fwd / swiglu_fp8_bwd ----------------------------------------------------------

// swiglu's result (X (N, 2F): gate then up; dY (N, F) in the backward) as swiglu's kernels
// compute it (swiglu_kernel.cuh: the same f32 expressions), rounded to T as they store it,
// for quantize_tiles: forward Y (N, F), one output; backward dX (N, 2F) as two outputs, the
// gate's gradient (columns j) and the up projection's (F + j), from one load of a chunk's
// gate, up and dY. kVec: every chunk whole and 16-byte aligned (F % kW == 0, X and dY
// aligned); else element by element up to F.
template <class T, bool kBwd, bool kVec_>
struct SwigluSource {
  static constexpr int kW = kFp8Width<T>;
  static constexpr int kOut = kBwd ? 2 : 1;
  static constexpr bool kVec = kVec_;
  static constexpr bool kBanded = false;
  struct Raw {
    Pack<T, kW> g, u, d;  // d: the backward's dY
  };
  const T* x;
  const T* dy;  // null in the forward
  int64_t f;
  __device__ __forceinline__ void load_one(const T* p, int64_t col, Pack<T, kW>& r) const {
    if constexpr (kVec) {
      r = *reinterpret_cast<const Pack<T, kW>*>(p + col);
    } else {
#pragma unroll
      for (int e = 0; e < kW; ++e) r.v[e] = col + e < f ? p[col + e] : T{};
    }
  }
  __device__ __forceinline__ void load(int64_t row, int64_t col, Raw& r) const {
    load_one(x + row * 2 * f, col, r.g);
    load_one(x + row * 2 * f + f, col, r.u);
    if constexpr (kBwd) load_one(dy + row * f, col, r.d);
  }
  static __device__ __forceinline__ float rounded(float v) { return to_f32<T>(from_f32<T>(v)); }
  __device__ __forceinline__ void values(const Raw& r, float (&v)[kOut][kW]) const {
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      const float g = to_f32<T>(r.g.v[e]), u = to_f32<T>(r.u.v[e]);
      if constexpr (kBwd) {
        const float d = to_f32<T>(r.d.v[e]);
        const float s = 1.0f / (1.0f + expf(-g));
        v[0][e] = rounded(d * u * s * (1.0f + g * (1.0f - s)));
        v[kOut - 1][e] = rounded(d * g * s);
      } else {
        v[0][e] = rounded(g / (1.0f + expf(-g)) * u);
      }
    }
  }
};

template <class T>
struct SwigluFp8Args {
  const T* x;          // (N, 2F)
  const T* dy;         // (N, F); null in the forward
  const float* scale;  // (1)
  uint8_t* y;          // forward Y (N, F), backward dX (N, 2F), or null
  uint8_t* yt;         // its transpose, or null
  float* amax;         // (1) or null
  float* scale_inv;    // (1) or null
  int64_t n, f;
};

// Blocks of the swiglu kernels a multiprocessor keeps resident (their __launch_bounds__
// minimum): 3 forward (at most 85 registers a thread; ptxas, CUDA 13.0, sm_90a: 60-80, no
// spills), 2 backward (its three loads a chunk and two outputs: 78-128 registers, no spills;
// at 3 it spilled).
constexpr int swiglu_fp8_blocks_per_sm(bool bwd) { return bwd ? 2 : 3; }

template <class T, bool kBwd, bool kVec, bool kE5M2>
__global__ void __launch_bounds__(kFp8TileThreads, swiglu_fp8_blocks_per_sm(kBwd))
    swiglu_fp8_kernel(SwigluFp8Args<T> a) {
  quantize_tiles<SwigluSource<T, kBwd, kVec>, kE5M2>(SwigluSource<T, kBwd, kVec>{a.x, a.dy, a.f},
                                                     a.scale, a.y, a.yt, a.amax, a.scale_inv, a.n,
                                                     a.f);
}

// ---- Which kernel (host) ----------------------------------------------------------------------

enum class Fp8Kernel {
  kFlat,            // quantize_kernel: Y only
  kTranspose,       // quantize_transpose_kernel
  kTransposeTyped,  // quantize_transpose_typed_kernel<T>, T X's storage type
};

struct Fp8QuantizePlan {
  Fp8Kernel kernel;
  bool vec, vec_y, vec_yt;  // the general kernels' vector accesses (vec: X's, and Y's for kFlat)
  unsigned blocks;          // of the launch: kFlatThreads (kFlat) or kFp8TileThreads threads each
};

// The kernel for X (M, K) of dtype xt with outputs y and yt (either may be null, not both):
// the typed transpose kernel when its alignment conditions hold (file comment) and `general`
// is false, else the general one; kFlat without yt. `general` forces the general kernels (to
// measure the typed one against it: LOOM_FP8_QUANTIZE=general, fp8_quantize.cu). `sms`: the
// device's multiprocessors (0 when unknown), which size the typed kernel's grid.
inline Fp8QuantizePlan fp8_quantize_plan(const void* x, DType xt, const void* y, const void* yt,
                                         int64_t m, int64_t k, bool general, int sms) {
  auto aligned = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;  // null (an absent Y) counts
  };
  const int64_t e = static_cast<int64_t>(dtype_size(xt));
  Fp8QuantizePlan p{};
  if (yt == nullptr) {
    p.kernel = Fp8Kernel::kFlat;
    p.vec = aligned(x, 4 * e) && aligned(y, 4);
    const int64_t chunks = (m * k + 3) / 4;
    p.blocks = static_cast<unsigned>(
        std::clamp<int64_t>((chunks + kFlatThreads - 1) / kFlatThreads, 1, kFp8MaxBlocks));
    return p;
  }
  const int64_t tiles = ((m + kFp8Tile - 1) / kFp8Tile) * ((k + kFp8Tile - 1) / kFp8Tile);
  p.blocks = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, kFp8MaxBlocks));
  const int64_t w = 16 / e;  // kFp8Width of X's type
  const bool typed =
      !general && aligned(x, 16) && k % w == 0 && aligned(y, w) && aligned(yt, 16) && m % 16 == 0;
  p.kernel = typed ? Fp8Kernel::kTransposeTyped : Fp8Kernel::kTranspose;
  if (typed && sms > 0)
    p.blocks = static_cast<unsigned>(
        std::min<int64_t>(tiles, int64_t{sms} * fp8_typed_blocks_per_sm(static_cast<size_t>(e))));
  p.vec = aligned(x, 4 * e) && k % 4 == 0;
  p.vec_y = aligned(y, 4) && k % 4 == 0;
  p.vec_yt = aligned(yt, 16) && m % 16 == 0;
  return p;
}

// The swiglu kernels' plan for X (N, 2F) of dtype xt, dY (null in the forward), Y and Yt
// (either null; dY present means the backward): kVec when X and dY are 16-byte aligned with F a
// multiple of the chunk, Y (when asked) aligned to a chunk's codes and Yt (when asked) to 16 bytes
// with N % 16 == 0; the grid is one wave of resident blocks (swiglu_fp8_blocks_per_sm a
// multiprocessor; at most kFp8MaxBlocks when `sms` is 0, unknown) or one block a tile where there
// are fewer.
struct SwigluFp8Plan {
  bool vec;
  unsigned blocks;  // of kFp8TileThreads threads
};
inline SwigluFp8Plan swiglu_fp8_plan(const void* x, const void* dy, const void* y, const void* yt,
                                     DType xt, int64_t n, int64_t f, int sms) {
  auto aligned = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;  // null (absent) counts
  };
  const int64_t w = 16 / static_cast<int64_t>(dtype_size(xt));
  SwigluFp8Plan p{};
  p.vec = aligned(x, 16) && aligned(dy, 16) && f % w == 0 && aligned(y, static_cast<size_t>(w)) &&
          aligned(yt, 16) && (yt == nullptr || n % 16 == 0);
  const int64_t tiles = ((n + kFp8Tile - 1) / kFp8Tile) * ((f + kFp8Tile - 1) / kFp8Tile);
  const int64_t wave =
      sms > 0 ? int64_t{sms} * swiglu_fp8_blocks_per_sm(dy != nullptr) : kFp8MaxBlocks;
  p.blocks = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, wave));
  return p;
}

}  // namespace loom::kernels::cuda::pointwise
