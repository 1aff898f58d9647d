// Device code of rope_fp8_bwd (rope_fp8.cu has the op's contract and the launch) and the
// host-side plan of its launch, in a header so that tests/kernels/cuda/pointwise_emulation runs
// the kernel on the CPU.
//
// dX (M = B T, K = G W) in the grouped QKV layout, a group's W = (H/G + 2) D columns being its
// query heads, its key head and its value head, each of D channels. The result is dX with
// channel i < half of every query and key head paired with i + half and turned by minus the
// angle pos * inv_freq[i] (rope_bwd), rounded to T, and quantised with fp8_quantize's tile loop
// (fp8_quantize_kernel.cuh: quantize_tiles, 64 x 64 tiles of 16-byte chunks, the next tile's
// loads in flight while this one's transposed rows are stored). RopeQkvSource loads each chunk
// of a rotated head together with its pair partners (the chunk half a head's rotary channels
// away), takes c and s from a table and rotates with rope_math.cuh's rope_y1 / rope_y2: the
// expressions of rope_typed_kernel, the kernel rope_bwd runs, with c and s from the same
// rope_cos_sin, so the codes are those of rope_bwd then fp8_quantize, bit for bit. Element by
// element where chunks would straddle a head or a half, or are not aligned (rope_fp8_plan).
//
// The table: the cosines and sines of the 64 rows of a tile, every pair index (2 x 64 x half
// f32 in dynamic shared memory, 32 KiB at half = 64), filled once a band of rows by the block
// (RopeQkvSource::band), whose tiles run along the rows (quantize_tiles' kBanded order). All
// the query and key heads of a row share its angles. At LLaMA 1.3B's shape (M = 8192, K = 6144,
// 12288 tiles, a grid of 396 blocks) a block's 31 tiles span one or two bands: about 2.1M
// rope_cos_sin where the tile loop took 33.5M (one an element rotated). With them in the loop
// the bf16 vector kernel was 4096 SASS instructions (16 inlined sincosf, 48 f64 multiplies) and
// fp8_quantize_bench timed it at 0.26 ms against 0.12 ms for rope_bwd then fp8_quantize on an
// H200 (BENCHMARKS.md, 2026-11-29); with the table, 2000 (the table's fill among them).
//
// Bytes (bf16, LLaMA 1.3B's M = 8192, K = 6144): reads dX once, plus the partners of the
// rotated two thirds (half a head's rotary channels away: in the same tile, or at half = 64 in
// the block's last or next tile, which reads them too: from L1 or L2, not memory), and writes Y
// and Yt in FP8: 4 M K. rope_bwd then fp8_quantize move 2 M K (2/3 of dX read and written) +
// 2 M K (dX read) + 2 M K (Y and Yt) = 6.7 M K.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "kernels/cuda/pointwise/fp8_quantize_kernel.cuh"
#include "kernels/cuda/pointwise/rope_math.cuh"

namespace loom::kernels::cuda::pointwise {

// Pair indices (the table's columns) a block's table holds at most: rotary_dim <= 256, a table of
// 64 KiB. Past it, rope_fp8_bwd fails and names the two-kernel path (rope_fp8.cu).
inline constexpr int64_t kRopeFp8MaxHalf = 128;

// Bytes of the table (dynamic shared memory) for `half` pairs: the cosines and the negated sines
// of the 64 rows of a band, f32.
constexpr size_t rope_fp8_table_bytes(int64_t half) {
  return 2 * static_cast<size_t>(kFp8Tile) * static_cast<size_t>(half) * sizeof(float);
}

// The block's dynamic shared memory, which holds the table.
#if defined(__CUDACC__)
__device__ __forceinline__ float* rope_fp8_table() {
  extern __shared__ __align__(16) float rope_fp8_dynamic_smem[];
  return rope_fp8_dynamic_smem;
}
#else
float* rope_fp8_table();  // the CPU emulation's stand-in (tests/kernels/cuda/pointwise_emulation)
#endif

// dX's columns as quantize_tiles' source: one output, chunks of kW columns. kVec: every chunk
// is 16-byte aligned and inside one half of one head (half and D multiples of kW); else every
// element finds its own role. kBanded: the cosines and sines of the tile's 64 rows, every pair
// index, are a table in shared memory that band() fills (rope_cos_sin, once an entry), and a
// block's tiles run along the rows: a band's table serves all its tiles in the block.
template <class T, bool kVec_>
struct RopeQkvSource {
  static constexpr int kW = kFp8Width<T>;
  static constexpr int kOut = 1;
  static constexpr bool kVec = kVec_;
  static constexpr bool kBanded = true;
  static constexpr uint32_t kFirst = 1u << 31;  // Raw::turn: pairs' first channels
  struct Raw {
    Pack<T, kW> x;  // the chunk
    Pack<T, kW> p;  // the pair partner of each element (0 where it passes through)
    uint32_t col;   // the chunk's first column
    uint32_t r;     // its row in the tile (the table's row)
    uint32_t turn;  // kVec: 0 where the chunk passes through, else 1 + the pair index of its first
                    // element, with kFirst where they are their pairs' first channels
  };
  const T* x;                           // (M, K)
  const int32_t* positions;             // (M) or null: row % t
  const float* inv_freq;                // (half)
  float* table_cos;                     // the table: (64, half) cosines,
  float* table_sin;                     // and (64, half) sines of minus the angle (rope_bwd)
  int64_t k;                            // K
  uint32_t t, width, d, half, rotated;  // T; a group's W; D; rotary_dim / 2; H/G + 1

  // The pair index of column `col` and whether it is the pair's first channel; false where the
  // column passes through (a value head, or a channel at or past 2 half).
  __device__ __forceinline__ bool role(uint32_t col, uint32_t* i, bool* first) const {
    const uint32_t j = col % width, ch = j % d;
    if (j / d >= rotated || ch >= 2 * half) return false;
    *first = ch < half;
    *i = *first ? ch : ch - half;
    return true;
  }
  // Row r = threadIdx.x / 4 of the table, pair indices threadIdx.x % 4, + 4, ...: the angles
  // pos * inv_freq[i] of row m0 + r (0 past M, never read), as rope_typed_kernel takes them.
  // Not inlined: called once or twice a block, its f64 and sincosf registers would otherwise
  // count in the tile loop's (rope_fp8_blocks_per_sm).
  __device__ __attribute__((noinline)) void band(int64_t m0, int64_t m) const {
    static_assert(kFp8TileThreads == 4 * kFp8Tile);
    const uint32_t r = threadIdx.x / 4;
    const int64_t row = m0 + r;
    const double pos = row >= m               ? 0.0
                       : positions != nullptr ? static_cast<double>(positions[row])
                                              : static_cast<double>(row % t);
    for (uint32_t i = threadIdx.x % 4; i < half; i += 4) {
      float c, s;
      rope_cos_sin(pos, inv_freq[i], &c, &s);
      table_cos[r * half + i] = c;
      table_sin[r * half + i] = -s;  // rope_bwd: minus the angle (rope_typed_kernel's sign)
    }
  }
  __device__ __forceinline__ void load(int64_t row, int64_t col, Raw& r) const {
    const T* xr = x + row * k;
    r.col = static_cast<uint32_t>(col);
    r.r = static_cast<uint32_t>(row % kFp8Tile);
    uint32_t i;
    bool first;
    if constexpr (kVec) {
      r.x = *reinterpret_cast<const Pack<T, kW>*>(xr + col);
      if (role(r.col, &i, &first)) {
        r.turn = (1 + i) | (first ? kFirst : 0u);
        r.p = *reinterpret_cast<const Pack<T, kW>*>(xr + (first ? col + half : col - half));
      } else {
        r.turn = 0;
        r.p = Pack<T, kW>{};
      }
    } else {
      r.turn = 0;
#pragma unroll
      for (int e = 0; e < kW; ++e) {
        const int64_t c = col + e;
        r.x.v[e] = c < k ? xr[c] : T{};
        r.p.v[e] = c < k && role(static_cast<uint32_t>(c), &i, &first)
                       ? xr[first ? c + half : c - half]
                       : T{};
      }
    }
  }
  // y = x1 c - x2 s (first) or x2 c + x1 s, with s the table's negated sine, rounded to T.
  static __device__ __forceinline__ float turned(float xe, float pe, float c, float s, bool first) {
    return to_f32<T>(from_f32<T>(first ? rope_y1(xe, pe, c, s) : rope_y2(pe, xe, c, s)));
  }
  __device__ __forceinline__ void values(const Raw& r, float (&v)[kOut][kW]) const {
    if constexpr (kVec) {
      if (r.turn == 0) {
#pragma unroll
        for (int e = 0; e < kW; ++e) v[0][e] = to_f32<T>(r.x.v[e]);
        return;
      }
      const bool first = (r.turn & kFirst) != 0;
      // A multiple of kW: 16-byte aligned, as the table (Pack's alignment).
      const uint32_t at = r.r * half + (r.turn & ~kFirst) - 1;
      const Pack<float, kW> c = *reinterpret_cast<const Pack<float, kW>*>(table_cos + at);
      const Pack<float, kW> s = *reinterpret_cast<const Pack<float, kW>*>(table_sin + at);
#pragma unroll
      for (int e = 0; e < kW; ++e)
        v[0][e] = turned(to_f32<T>(r.x.v[e]), to_f32<T>(r.p.v[e]), c.v[e], s.v[e], first);
    } else {
#pragma unroll
      for (int e = 0; e < kW; ++e) {
        uint32_t i;
        bool first;
        const float xe = to_f32<T>(r.x.v[e]);
        if (!role(r.col + e, &i, &first)) {
          v[0][e] = xe;
          continue;
        }
        const uint32_t at = r.r * half + i;
        v[0][e] = turned(xe, to_f32<T>(r.p.v[e]), table_cos[at], table_sin[at], first);
      }
    }
  }
};

template <class T>
struct RopeFp8Args {
  const T* x;                // dX (M, K)
  const int32_t* positions;  // (M) or null
  const float* inv_freq;     // (half)
  const float* scale;        // (1)
  uint8_t* y;                // (M, K) or null
  uint8_t* yt;               // (K, M) or null
  float* amax;               // (1) or null
  float* scale_inv;          // (1) or null
  int64_t m, k;
  uint32_t t, width, d, half, rotated;  // as RopeQkvSource's
};

// Blocks of the kernel a multiprocessor keeps resident (its __launch_bounds__ minimum), for dX's
// element size, where their shared memory fits (rope_fp8_plan): 4 for bf16 / f16 (64 registers,
// no spills: the table's fill is a call of its own, RopeQkvSource::band, so that its f64 and
// sincosf registers do not count in the tile loop), 3 for f32 (its 4 chunks a thread spill at
// 64). ptxas, CUDA 13.0, sm_90a: rope_fp8.cu's comment.
constexpr int rope_fp8_blocks_per_sm(size_t elem) { return elem == 4 ? 3 : 4; }

template <class T, bool kVec, bool kE5M2>
__global__ void __launch_bounds__(kFp8TileThreads, rope_fp8_blocks_per_sm(sizeof(T)))
    rope_fp8_kernel(RopeFp8Args<T> a) {
  float* table = rope_fp8_table();  // rope_fp8_table_bytes(a.half) of dynamic shared memory
  const RopeQkvSource<T, kVec> src{
      a.x,     a.positions, a.inv_freq, table,    table + kFp8Tile * a.half, a.k, a.t,
      a.width, a.d,         a.half,     a.rotated};
  quantize_tiles<RopeQkvSource<T, kVec>, kE5M2>(src, a.scale, a.y, a.yt, a.amax, a.scale_inv, a.m,
                                                a.k);
}

// ---- The launch (host) ------------------------------------------------------------------------

struct RopeFp8Plan {
  bool vec;
  unsigned blocks;  // of kFp8TileThreads threads
  size_t smem;      // dynamic shared memory a block: rope_fp8_table_bytes(half)
};
// For dX (M, K) of dtype xt with heads of D channels, half pairs rotated, and outputs y, yt
// (either null): kVec when dX is 16-byte aligned with D and half multiples of the chunk, Y (when
// asked) aligned to a chunk's codes and Yt (when asked) to 16 bytes with M % 16 == 0; the grid
// is one wave of resident blocks or one block a tile where there are fewer. Resident: at most
// rope_fp8_blocks_per_sm a multiprocessor, fewer where their shared memory (the 64 x 68-byte
// tile, the table and the 1 KiB the device reserves a block) exceeds `smem_per_sm`, at least 1;
// `sms` 0 (unknown): kFp8MaxBlocks; `smem_per_sm` 0 (unknown): rope_fp8_blocks_per_sm.
inline RopeFp8Plan rope_fp8_plan(const void* x, const void* y, const void* yt, DType xt, int64_t m,
                                 int64_t k, int64_t d, int64_t half, int sms, int smem_per_sm) {
  auto aligned = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;  // null (absent) counts
  };
  const int64_t w = 16 / static_cast<int64_t>(dtype_size(xt));
  RopeFp8Plan p{};
  p.vec = aligned(x, 16) && d % w == 0 && half % w == 0 && aligned(y, static_cast<size_t>(w)) &&
          aligned(yt, 16) && (yt == nullptr || m % 16 == 0);
  p.smem = rope_fp8_table_bytes(half);
  const int64_t per_block = static_cast<int64_t>(p.smem) + kFp8Tile * kFp8TileStride + 1024;
  const int64_t most = rope_fp8_blocks_per_sm(dtype_size(xt));
  const int64_t resident =
      smem_per_sm > 0 ? std::clamp<int64_t>(smem_per_sm / per_block, 1, most) : most;
  const int64_t tiles = ((m + kFp8Tile - 1) / kFp8Tile) * ((k + kFp8Tile - 1) / kFp8Tile);
  const int64_t wave = sms > 0 ? int64_t{sms} * resident : kFp8MaxBlocks;
  p.blocks = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, wave));
  return p;
}

}  // namespace loom::kernels::cuda::pointwise
