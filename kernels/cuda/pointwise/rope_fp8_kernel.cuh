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
// away), takes c and s from rope_math.cuh's rope_cos_sin and rotates with its rope_y1 /
// rope_y2: the expressions of rope_typed_kernel, the kernel rope_bwd runs, so the codes are
// those of rope_bwd then fp8_quantize, bit for bit. Element by element where chunks would
// straddle a head or a half, or are not aligned (rope_fp8_plan).
//
// Bytes (bf16, LLaMA 1.3B's M = 8192, K = 6144): reads dX once, plus the partners of the
// rotated two thirds (which the neighbouring chunk of the same tile row reads too: they come
// from L1 or L2, not memory), and writes Y and Yt in FP8: 4 M K. rope_bwd then fp8_quantize
// move 2 M K (2/3 of dX read and written) + 2 M K (dX read) + 2 M K (Y and Yt) = 6.7 M K.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "kernels/cuda/pointwise/fp8_quantize_kernel.cuh"
#include "kernels/cuda/pointwise/rope_math.cuh"

namespace loom::kernels::cuda::pointwise {

// dX's columns as quantize_tiles' source: one output, chunks of kW columns. kVec: every chunk
// is 16-byte aligned and inside one half of one head (half and D multiples of kW); else every
// element finds its own role.
template <class T, bool kVec_>
struct RopeQkvSource {
  static constexpr int kW = kFp8Width<T>;
  static constexpr int kOut = 1;
  static constexpr bool kVec = kVec_;
  struct Raw {
    Pack<T, kW> x;  // the chunk
    Pack<T, kW> p;  // the pair partner of each element (0 where it passes through)
    uint32_t col;   // the chunk's first column
    int32_t pos;    // its token's position
  };
  const T* x;                           // (M, K)
  const int32_t* positions;             // (M) or null: row % t
  const float* inv_freq;                // (half)
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
  __device__ __forceinline__ void load(int64_t row, int64_t col, Raw& r) const {
    const T* xr = x + row * k;
    r.col = static_cast<uint32_t>(col);
    r.pos = positions != nullptr ? positions[row] : static_cast<int32_t>(row % t);
    uint32_t i;
    bool first;
    if constexpr (kVec) {
      r.x = *reinterpret_cast<const Pack<T, kW>*>(xr + col);
      if (role(r.col, &i, &first))
        r.p = *reinterpret_cast<const Pack<T, kW>*>(xr + (first ? col + half : col - half));
      else
        r.p = Pack<T, kW>{};
    } else {
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
  __device__ __forceinline__ void values(const Raw& r, float (&v)[kOut][kW]) const {
    uint32_t i0 = 0;
    bool first0 = false, rot0 = false;
    if constexpr (kVec) rot0 = role(r.col, &i0, &first0);
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      uint32_t i = i0 + e;
      bool first = first0, rot = rot0;
      if constexpr (!kVec) rot = role(r.col + e, &i, &first);
      const float xe = to_f32<T>(r.x.v[e]);
      if (!rot) {
        v[0][e] = xe;
        continue;
      }
      float c, s;
      rope_cos_sin(static_cast<double>(r.pos), inv_freq[i], &c, &s);
      s = -s;  // rope_bwd: minus the angle (rope_typed_kernel's sign)
      const float pe = to_f32<T>(r.p.v[e]);
      v[0][e] = to_f32<T>(from_f32<T>(first ? rope_y1(xe, pe, c, s) : rope_y2(pe, xe, c, s)));
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

// Blocks of the kernel a multiprocessor keeps resident (its __launch_bounds__ minimum): 3, as
// the swiglu forward's two loads a chunk (ptxas, CUDA 13.0, sm_90a: rope_fp8.cu's comment).
inline constexpr int kRopeFp8BlocksPerSm = 3;

template <class T, bool kVec, bool kE5M2>
__global__ void __launch_bounds__(kFp8TileThreads, kRopeFp8BlocksPerSm)
    rope_fp8_kernel(RopeFp8Args<T> a) {
  const RopeQkvSource<T, kVec> src{a.x,     a.positions, a.inv_freq, a.k,      a.t,
                                   a.width, a.d,         a.half,     a.rotated};
  quantize_tiles<RopeQkvSource<T, kVec>, kE5M2>(src, a.scale, a.y, a.yt, a.amax, a.scale_inv, a.m,
                                                a.k);
}

// ---- The launch (host) ------------------------------------------------------------------------

struct RopeFp8Plan {
  bool vec;
  unsigned blocks;  // of kFp8TileThreads threads
};
// For dX (M, K) of dtype xt with heads of D channels, half pairs rotated, and outputs y, yt
// (either null): kVec when dX is 16-byte aligned with D and half multiples of the chunk, Y (when
// asked) aligned to a chunk's codes and Yt (when asked) to 16 bytes with M % 16 == 0; the grid
// is one wave of resident blocks (kRopeFp8BlocksPerSm a multiprocessor; at most kFp8MaxBlocks
// when `sms` is 0, unknown) or one block a tile where there are fewer.
inline RopeFp8Plan rope_fp8_plan(const void* x, const void* y, const void* yt, DType xt, int64_t m,
                                 int64_t k, int64_t d, int64_t half, int sms) {
  auto aligned = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;  // null (absent) counts
  };
  const int64_t w = 16 / static_cast<int64_t>(dtype_size(xt));
  RopeFp8Plan p{};
  p.vec = aligned(x, 16) && d % w == 0 && half % w == 0 && aligned(y, static_cast<size_t>(w)) &&
          aligned(yt, 16) && (yt == nullptr || m % 16 == 0);
  const int64_t tiles = ((m + kFp8Tile - 1) / kFp8Tile) * ((k + kFp8Tile - 1) / kFp8Tile);
  const int64_t wave = sms > 0 ? int64_t{sms} * kRopeFp8BlocksPerSm : kFp8MaxBlocks;
  p.blocks = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, wave));
  return p;
}

}  // namespace loom::kernels::cuda::pointwise
