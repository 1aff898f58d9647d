// The tiled generic attention kernels: CUDA cores, f32 arithmetic, one storage dtype for
// every tensor (Io), head dim D <= kAttentionTiledMaxD. They serve what the tensor-core
// kernels do not take (f32 above all: the default spec) whenever a block's tiles fit in
// shared memory; the warp-per-row kernels (attention_generic_kernel.cuh) serve the rest.
// Same semantics as both: mask, Philox dropout index, lse, fully masked rows.
//
// Algorithm (FlashAttention-2's loop order, in f32 on CUDA cores): 64-row tiles of queries
// and keys in shared memory, each 64 x 64 product split over 256 threads as a 16 x 16 grid
// of 4 x 4 blocks, so every operand read from shared memory serves four products:
//   forward:  block per (query tile, b, h): online softmax over the key tiles, O and the
//             running max / sum of the block's rows in registers.
//   backward: the delta kernel (attention_bwd.cu), then block per (key tile, b, g): dK, dV
//             summed over the group's query heads and all query tiles in registers; then
//             block per (query tile, b, h): dQ over the key tiles. Each output element has
//             one writer (no atomics), so the result does not depend on scheduling.
// Tiles reach shared memory through registers (TiledRegs): each loop issues the loads of its
// next tiles before it computes on the current ones, and stores them after.
// Thread (ty, tx) = (tid / 16, tid % 16) owns rows 4 ty .. 4 ty + 3 of every tile product;
// of a 64 x 64 score tile the columns tx + 16 j (j < 4: spread, so that the 16 threads of a
// row read 16 different operand rows without bank conflicts); of a 64 x D output the
// columns 4 tx + 64 c .. + 3 (c < kDv: one float4 of shared memory per row and step).
// Operand tiles are row-major with a row stride of D rounded up to 4 plus 4 floats (float4
// reads stay aligned, consecutive rows start 4 banks apart); pad columns and rows past the
// end of the tensor are zero, so they add nothing to any product.
#pragma once

#include "kernels/cuda/attention/attention_device.cuh"
#include "kernels/cuda/attention/attention_generic_kernel.cuh"
#include "kernels/cuda/attention/attention_params.cuh"

namespace loom::kernels::cuda::attn {

inline constexpr int kTiledRows = 64;             // rows (queries or keys) of every tile
inline constexpr int kTiledThreads = 256;         // 16 x 16 threads, 4 x 4 products each
inline constexpr int kTiledLdS = kTiledRows + 4;  // row stride of a 64 x 64 score tile

// Row stride (floats) of a 64 x D operand tile: D rounded up to 4, plus 4.
__host__ __device__ constexpr int tiled_ld(int64_t d) {
  return static_cast<int>((d + 3) / 4 * 4 + 4);
}
// Float4 column groups per thread of a 64 x D output (kDv template argument).
__host__ __device__ constexpr int tiled_dv(int64_t d) { return d <= 64 ? 1 : 2; }

// Shared floats of a block: the forward holds Q, K, V tiles and the probabilities; both
// backward kernels hold four operand tiles, two score tiles (dq uses one) and two per-row
// scalars (lse, delta).
__host__ __device__ constexpr int64_t tiled_fwd_floats(int64_t d) {
  return 3 * kTiledRows * tiled_ld(d) + kTiledRows * kTiledLdS;
}
__host__ __device__ constexpr int64_t tiled_bwd_floats(int64_t d) {
  return 4 * kTiledRows * tiled_ld(d) + 2 * kTiledRows * kTiledLdS + 2 * kTiledRows;
}

// Row j of a run of rows that starts at row0 and steps by `step` elements: the rows of
// consecutive queries (or keys) of one (b, head) in a strided view (RowStrides) or a packed
// tensor.
struct TiledRows {
  int64_t row0, step;
  __device__ __forceinline__ int64_t operator()(int j) const { return row0 + j * step; }
};
// Rows t0, t0 + 1, ... of head h of batch entry b: of a view with row strides r
// (tiled_rows), of the call's packed (B, T, H, D) O or dO (tiled_packed_rows).
__device__ __forceinline__ TiledRows tiled_rows(RowStrides r, int64_t b, int64_t t0, int64_t h) {
  return {r.at(b, t0, h), r.t_};
}
__device__ __forceinline__ TiledRows tiled_packed_rows(const AttentionParams& p, int64_t b,
                                                       int64_t t0, int64_t h) {
  return {((b * p.t + t0) * p.h + h) * p.d, p.h * p.d};
}

// A 64 x D operand tile on its way from global to shared memory, in the registers of the
// block's threads: warp w holds rows w + 8 i (i < 8), lane l columns l + 32 j (j < 2 kDv,
// the 64 kDv columns that cover D <= 64 kDv). Splitting the copy in two lets a thread issue
// all of its loads before it waits for any (tiled_fetch), and lets the loops issue the next
// tile's loads before they compute on the current one (tiled_put then stores them): a block
// per multiprocessor, as the default spec's grids are, has no other warps to hide the
// latency of one load after another.
template <int kDv>
struct TiledRegs {
  float v[kTiledRows / (kTiledThreads / 32)][2 * kDv];
};

// Loads rows j < n of a tile from src (row j's first element at index row_of(j)) into r, as
// f32; rows j >= n and the columns from d_model on are zero. Consecutive lanes read
// consecutive elements of a row (coalesced).
template <class Io, int kDv, class RowOf>
__device__ __forceinline__ void tiled_fetch(TiledRegs<kDv>& r, const void* src, DType dt,
                                            RowOf row_of, int n, int d_model) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kTiledRows / (kTiledThreads / 32); ++i) {
    const int row = warp + (kTiledThreads / 32) * i;
    const bool valid = row < n;
    const int64_t base = valid ? row_of(row) : 0;
#pragma unroll
    for (int j = 0; j < 2 * kDv; ++j) {
      const int c = lane + 32 * j;
      r.v[i][j] = valid && c < d_model ? Io::load(src, dt, base + c) : 0.0f;
    }
  }
}

// Stores r (tiled_fetch) into a tile of row stride tiled_ld(d_model): all 64 rows and the
// tile's cols = ld - 4 columns (the pad and rows past the end zero, as fetched). The caller
// synchronises.
template <int kDv>
__device__ __forceinline__ void tiled_put(float* tile, const TiledRegs<kDv>& r, int d_model) {
  const int ld = tiled_ld(d_model), cols = ld - 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kTiledRows / (kTiledThreads / 32); ++i) {
    const int row = warp + (kTiledThreads / 32) * i;
#pragma unroll
    for (int j = 0; j < 2 * kDv; ++j) {
      const int c = lane + 32 * j;
      if (c < cols) tile[row * ld + c] = r.v[i][j];
    }
  }
}

// acc[i][j] += A[4 ty + i] . B[tx + 16 j] (rows of two 64 x D operand tiles, stride ld,
// over the cols = ld - 4 columns, the pad zero).
__device__ __forceinline__ void tiled_dots(const float* a, const float* b, int ld, int ty, int tx,
                                           float (&acc)[4][4]) {
  const int cols = ld - 4;
  for (int d = 0; d < cols; d += 4) {
    float4 av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = *reinterpret_cast<const float4*>(a + (4 * ty + i) * ld + d);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      bv[j] = *reinterpret_cast<const float4*>(b + (tx + 16 * j) * ld + d);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float s = acc[i][j];
        s = fmaf(av[i].x, bv[j].x, s);
        s = fmaf(av[i].y, bv[j].y, s);
        s = fmaf(av[i].z, bv[j].z, s);
        acc[i][j] = fmaf(av[i].w, bv[j].w, s);
      }
  }
}

// acc[i][4 c + e] += sum_k W[4 ty + i][k] * X[k][4 tx + 64 c + e] over the 64 rows k of a
// score tile W (stride kTiledLdS) and an operand tile X (stride ld).
template <int kDv>
__device__ __forceinline__ void tiled_accumulate(const float* w, const float* x, int ld, int ty,
                                                 int tx, float (&acc)[4][4 * kDv]) {
  const int cols = ld - 4;
  for (int k = 0; k < kTiledRows; k += 4) {
    float4 wv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      wv[i] = *reinterpret_cast<const float4*>(w + (4 * ty + i) * kTiledLdS + k);
#pragma unroll
    for (int c = 0; c < kDv; ++c) {
      const int col = 4 * tx + 64 * c;
      if (col >= cols) continue;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const float4 xv = *reinterpret_cast<const float4*>(x + (k + kk) * ld + col);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float wik = kk == 0 ? wv[i].x : kk == 1 ? wv[i].y : kk == 2 ? wv[i].z : wv[i].w;
          acc[i][4 * c + 0] = fmaf(wik, xv.x, acc[i][4 * c + 0]);
          acc[i][4 * c + 1] = fmaf(wik, xv.y, acc[i][4 * c + 1]);
          acc[i][4 * c + 2] = fmaf(wik, xv.z, acc[i][4 * c + 2]);
          acc[i][4 * c + 3] = fmaf(wik, xv.w, acc[i][4 * c + 3]);
        }
      }
    }
  }
}

// Stores rows i with 4 ty + i < n of a thread's 64 x D output block, scaled by mult[i], to
// dst (row r's first element at index row_of(r)).
template <class Io, int kDv, class RowOf>
__device__ __forceinline__ void tiled_store(void* dst, DType dt, RowOf row_of, int n, int d_model,
                                            int ty, int tx, const float (&acc)[4][4 * kDv],
                                            const float (&mult)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = 4 * ty + i;
    if (r >= n) continue;
    const int64_t base = row_of(r);
#pragma unroll
    for (int c = 0; c < kDv; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 4 * tx + 64 * c + e;
        if (col < d_model) Io::store(dst, dt, base + col, acc[i][4 * c + e] * mult[i]);
      }
  }
}

// Over the 16 threads of a row (lanes 0-15 or 16-31 of a warp: one ty).
__device__ __forceinline__ float row16_max(float x) {
#pragma unroll
  for (int o = 8; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float row16_sum(float x) {
#pragma unroll
  for (int o = 8; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The block's place in a grid of tiles (of n rows) x outers blocks, outers = gridDim.x /
// tiles, started tile by tile from the one with the most work: under the causal mask the
// last query tiles see the most keys (last_heaviest, the forward and dQ kernels) and the
// first key tiles the most queries (the dK / dV kernel), so a grid of several waves ends
// with its shortest blocks (longest processing time first). Each output element still has
// one writer: the order changes no result.
struct TiledBlock {
  int64_t tile0;  // first row of the tile
  int rows;       // rows of the tile (<= 64)
  int64_t outer;  // which of the outers (b, head) pairs
};
__device__ __forceinline__ TiledBlock tiled_block(int64_t n, bool last_heaviest) {
  const int64_t tiles = (n + kTiledRows - 1) / kTiledRows;
  const int64_t outers = gridDim.x / tiles;
  const int64_t blk = blockIdx.x, rank = blk / outers;  // rank 0 starts first
  TiledBlock tb;
  tb.tile0 = (last_heaviest ? tiles - 1 - rank : rank) * kTiledRows;
  tb.rows = static_cast<int>(min64(kTiledRows, n - tb.tile0));
  tb.outer = blk % outers;
  return tb;
}

// Keys [0, limit) may be visible to some query of [t0, t0 + n).
__device__ __forceinline__ int64_t tiled_key_limit(const AttentionParams& p, int64_t t0, int n) {
  return p.causal ? min64(p.s, t0 + n - 1 + p.s - p.t + 1) : p.s;
}

// Segment ids of batch row b: the queries' and the keys' (null without segment ids).
struct TiledSegments {
  const int32_t* q;
  const int32_t* k;
};
__device__ __forceinline__ TiledSegments tiled_segments(const AttentionParams& p, int64_t b) {
  return {p.seg != nullptr ? p.seg + b * p.t : nullptr,
          p.seg != nullptr ? p.kseg + b * p.s : nullptr};
}

// Query t sees key `key`: both exist (in_tiles: within their tiles' rows), the causal mask
// and the segment ids let it.
__device__ __forceinline__ bool tiled_visible(const AttentionParams& p, TiledSegments seg,
                                              bool in_tiles, int64_t t, int64_t key) {
  return in_tiles && !causal_hidden(p.causal, t, key, p.t, p.s) &&
         !other_segment(seg.q, seg.k, t, key);
}

// The K and V rows of key tile [k0, k0 + n) of (b, g) into registers (tiled_fetch): the
// forward's and the dQ kernel's next tile, issued before the current one's products.
template <class Io, int kDv>
__device__ __forceinline__ void tiled_fetch_kv(TiledRegs<kDv>& rk, TiledRegs<kDv>& rv,
                                               const AttentionParams& p, int64_t b, int64_t g,
                                               int64_t k0, int64_t limit) {
  const int n = static_cast<int>(min64(kTiledRows, limit - k0));
  const int D = static_cast<int>(p.d);
  tiled_fetch<Io, kDv>(rk, p.k, p.dt_k, tiled_rows(p.k_rows, b, k0, g), n, D);
  tiled_fetch<Io, kDv>(rv, p.v, p.dt_v, tiled_rows(p.v_rows, b, k0, g), n, D);
}

// Forward: block per (query tile, b, h); grid = ceil(T / 64) * B * H.
template <class Io, int kDv>
__global__ void __launch_bounds__(kTiledThreads)
    attention_fwd_tiled_kernel(const AttentionParams p) {
  extern __shared__ float shared[];
  const int ld = tiled_ld(p.d), D = static_cast<int>(p.d);
  float* sq = shared;
  float* sk = sq + kTiledRows * ld;
  float* sv = sk + kTiledRows * ld;
  float* sp = sv + kTiledRows * ld;  // 64 x 64 probabilities (dropout applied)
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const TiledBlock tb = tiled_block(p.t, true);
  const int64_t b = tb.outer / p.h, h = tb.outer % p.h, g = h / p.group, t0 = tb.tile0;
  const TiledSegments seg = tiled_segments(p, b);
  const float scale_log2 = p.scale * kLog2e;
  const int64_t limit = tiled_key_limit(p, t0, tb.rows);
  TiledRegs<kDv> rk, rv;  // the next key tile's K and V, on their way to shared memory
  {
    TiledRegs<kDv> rq;
    tiled_fetch<Io, kDv>(rq, p.q, p.dt_q, tiled_rows(p.q_rows, b, t0, h), tb.rows, D);
    if (limit > 0) tiled_fetch_kv<Io, kDv>(rk, rv, p, b, g, 0, limit);
    tiled_put<kDv>(sq, rq, D);
  }

  float m[4], l[4], acc[4][4 * kDv];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;  // running max (log2 domain) and sum: equal in the row's 16 threads
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4 * kDv; ++c) acc[i][c] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < limit; k0 += kTiledRows) {
    const int nk = static_cast<int>(min64(kTiledRows, limit - k0));
    __syncthreads();  // every thread is done with the previous tiles
    tiled_put<kDv>(sk, rk, D);
    tiled_put<kDv>(sv, rv, D);
    __syncthreads();
    if (k0 + kTiledRows < limit) tiled_fetch_kv<Io, kDv>(rk, rv, p, b, g, k0 + kTiledRows, limit);
    float s[4][4] = {};
    tiled_dots(sq, sk, ld, ty, tx, s);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t t = t0 + 4 * ty + i;
      float x[4], rmax = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t key = k0 + tx + 16 * j;
        const bool visible =
            tiled_visible(p, seg, 4 * ty + i < tb.rows && tx + 16 * j < nk, t, key);
        x[j] = visible ? s[i][j] * scale_log2 : -INFINITY;
        rmax = fmaxf(rmax, x[j]);
      }
      const float m_new = fmaxf(m[i], row16_max(rmax));
      const float shift = m_new == -INFINITY ? 0.0f : m_new;  // see attention_fwd.cu
      const float corr = exp2f(m[i] - shift);
      float rsum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float pr = exp2f(x[j] - shift);
        rsum += pr;
        if (p.dropout && pr != 0.0f)
          pr *= dropout_mult(p.key, p.counter, dropout_index(p, b, h, t, k0 + tx + 16 * j),
                             p.threshold, p.keep_scale);
        sp[(4 * ty + i) * kTiledLdS + tx + 16 * j] = pr;
      }
      l[i] = l[i] * corr + row16_sum(rsum);
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < 4 * kDv; ++c) acc[i][c] *= corr;
    }
    __syncthreads();
    tiled_accumulate<kDv>(sp, sv, ld, ty, tx, acc);
  }
  float inv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
  tiled_store<Io, kDv>(p.o, p.dt_o, tiled_packed_rows(p, b, t0, h), tb.rows, D, ty, tx, acc, inv);
  if (tx == 0)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (4 * ty + i < tb.rows)
        p.lse[(b * p.h + h) * p.t + t0 + 4 * ty + i] =
            l[i] > 0.0f ? (m[i] + log2f(l[i])) * kLn2 : -INFINITY;
}

// The lse and delta of rows j < n of (b, h) from query t0 on, -inf and 0 (no probability)
// for the rest, on their way to shared memory: thread j < 64 holds row j's.
struct TiledRowScalars {
  float lse, delta;
};
__device__ __forceinline__ void tiled_fetch_row_scalars(const AttentionParams& p, int64_t b,
                                                        int64_t h, int64_t t0, int n,
                                                        TiledRowScalars& r) {
  const int j = threadIdx.x;
  if (j >= kTiledRows) return;
  const int64_t row = (b * p.h + h) * p.t + t0 + j;
  r.lse = j < n ? p.lse_in[row] : -INFINITY;
  r.delta = j < n ? p.delta[row] : 0.0f;
}
__device__ __forceinline__ void tiled_put_row_scalars(const TiledRowScalars& r, float* slse,
                                                      float* sdelta) {
  const int j = threadIdx.x;
  if (j >= kTiledRows) return;
  slse[j] = r.lse;
  sdelta[j] = r.delta;
}

// Backward pass 1: block per (key tile, b, g); grid = ceil(S / 64) * B * G. Thread rows are
// keys, score columns queries.
template <class Io, int kDv>
__global__ void __launch_bounds__(kTiledThreads)
    attention_bwd_dkv_tiled_kernel(const AttentionParams p) {
  extern __shared__ float shared[];
  const int ld = tiled_ld(p.d), D = static_cast<int>(p.d);
  float* sk = shared;
  float* sv = sk + kTiledRows * ld;
  float* sq = sv + kTiledRows * ld;
  float* sdo = sq + kTiledRows * ld;
  float* spz = sdo + kTiledRows * ld;         // (64 keys, 64 queries): probability x dropout
  float* sds = spz + kTiledRows * kTiledLdS;  // (64 keys, 64 queries): dS
  float* slse = sds + kTiledRows * kTiledLdS;
  float* sdelta = slse + kTiledRows;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const TiledBlock tb = tiled_block(p.s, false);
  const int64_t b = tb.outer / p.g, g = tb.outer % p.g, s0 = tb.tile0;
  const TiledSegments seg = tiled_segments(p, b);
  // Queries that see the tile's first key: t >= s0 - (S - T) under the causal mask. The
  // block visits query tiles q0 = t_begin, t_begin + 64, ... < T of each head h of the group
  // in turn, the next one's Q, dO, lse and delta in registers during the current products.
  const int64_t t_begin = p.causal ? max64(0, s0 - (p.s - p.t)) : 0;
  const int64_t h_end = (g + 1) * p.group;
  int64_t h = g * p.group, q0 = t_begin;
  TiledRegs<kDv> rq, rdo;
  TiledRowScalars rs{};
  auto fetch_queries = [&](int64_t hh, int64_t qq) {
    const int n = static_cast<int>(min64(kTiledRows, p.t - qq));
    tiled_fetch<Io, kDv>(rq, p.q, p.dt_q, tiled_rows(p.q_rows, b, qq, hh), n, D);
    tiled_fetch<Io, kDv>(rdo, p.dout, p.dt_do, tiled_packed_rows(p, b, qq, hh), n, D);
    tiled_fetch_row_scalars(p, b, hh, qq, n, rs);
  };
  if (q0 >= p.t) h = h_end;  // no query sees the tile
  {
    TiledRegs<kDv> rk, rv;
    tiled_fetch<Io, kDv>(rk, p.k, p.dt_k, tiled_rows(p.k_rows, b, s0, g), tb.rows, D);
    tiled_fetch<Io, kDv>(rv, p.v, p.dt_v, tiled_rows(p.v_rows, b, s0, g), tb.rows, D);
    if (h < h_end) fetch_queries(h, q0);
    tiled_put<kDv>(sk, rk, D);
    tiled_put<kDv>(sv, rv, D);
  }

  float dk[4][4 * kDv] = {}, dv[4][4 * kDv] = {};
  while (h < h_end) {
    const int nq = static_cast<int>(min64(kTiledRows, p.t - q0));
    __syncthreads();
    tiled_put<kDv>(sq, rq, D);
    tiled_put<kDv>(sdo, rdo, D);
    tiled_put_row_scalars(rs, slse, sdelta);
    __syncthreads();
    int64_t h_next = h, q_next = q0 + kTiledRows;
    if (q_next >= p.t) {
      ++h_next;
      q_next = t_begin;
    }
    if (h_next < h_end) fetch_queries(h_next, q_next);
    {
      float qk[4][4] = {}, dp[4][4] = {};
      tiled_dots(sk, sq, ld, ty, tx, qk);
      tiled_dots(sv, sdo, ld, ty, tx, dp);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t key = s0 + 4 * ty + i, t = q0 + tx + 16 * j;
          float pz = 0.0f, ds = 0.0f;
          if (tiled_visible(p, seg, 4 * ty + i < tb.rows && tx + 16 * j < nq, t, key)) {
            float pr, z;
            recompute(p, qk[i][j], slse[tx + 16 * j], b, h, t, key, pr, z);
            pz = pr * z;
            ds = p.scale * pr * (dp[i][j] * z - sdelta[tx + 16 * j]);
          }
          spz[(4 * ty + i) * kTiledLdS + tx + 16 * j] = pz;
          sds[(4 * ty + i) * kTiledLdS + tx + 16 * j] = ds;
        }
      __syncthreads();
      tiled_accumulate<kDv>(spz, sdo, ld, ty, tx, dv);
      tiled_accumulate<kDv>(sds, sq, ld, ty, tx, dk);
    }
    h = h_next;
    q0 = q_next;
  }
  const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  tiled_store<Io, kDv>(p.dk, p.dt_dk, tiled_rows(p.dk_rows, b, s0, g), tb.rows, D, ty, tx, dk, one);
  tiled_store<Io, kDv>(p.dv, p.dt_dv, tiled_rows(p.dv_rows, b, s0, g), tb.rows, D, ty, tx, dv, one);
}

// Backward pass 2: block per (query tile, b, h); grid = ceil(T / 64) * B * H.
template <class Io, int kDv>
__global__ void __launch_bounds__(kTiledThreads)
    attention_bwd_dq_tiled_kernel(const AttentionParams p) {
  extern __shared__ float shared[];
  const int ld = tiled_ld(p.d), D = static_cast<int>(p.d);
  float* sq = shared;
  float* sdo = sq + kTiledRows * ld;
  float* sk = sdo + kTiledRows * ld;
  float* sv = sk + kTiledRows * ld;
  float* sds = sv + kTiledRows * ld;  // (64 queries, 64 keys): dS
  float* slse = sds + kTiledRows * kTiledLdS;
  float* sdelta = slse + kTiledRows;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const TiledBlock tb = tiled_block(p.t, true);
  const int64_t b = tb.outer / p.h, h = tb.outer % p.h, g = h / p.group, t0 = tb.tile0;
  const TiledSegments seg = tiled_segments(p, b);
  const int64_t limit = tiled_key_limit(p, t0, tb.rows);
  TiledRegs<kDv> rk, rv;  // the next key tile's K and V, on their way to shared memory
  {
    TiledRegs<kDv> rq, rdo;
    TiledRowScalars rs{};
    tiled_fetch<Io, kDv>(rq, p.q, p.dt_q, tiled_rows(p.q_rows, b, t0, h), tb.rows, D);
    tiled_fetch<Io, kDv>(rdo, p.dout, p.dt_do, tiled_packed_rows(p, b, t0, h), tb.rows, D);
    tiled_fetch_row_scalars(p, b, h, t0, tb.rows, rs);
    if (limit > 0) tiled_fetch_kv<Io, kDv>(rk, rv, p, b, g, 0, limit);
    tiled_put<kDv>(sq, rq, D);
    tiled_put<kDv>(sdo, rdo, D);
    tiled_put_row_scalars(rs, slse, sdelta);
  }

  float dq[4][4 * kDv] = {};
  for (int64_t k0 = 0; k0 < limit; k0 += kTiledRows) {
    const int nk = static_cast<int>(min64(kTiledRows, limit - k0));
    __syncthreads();
    tiled_put<kDv>(sk, rk, D);
    tiled_put<kDv>(sv, rv, D);
    __syncthreads();
    if (k0 + kTiledRows < limit) tiled_fetch_kv<Io, kDv>(rk, rv, p, b, g, k0 + kTiledRows, limit);
    float qk[4][4] = {}, dp[4][4] = {};
    tiled_dots(sq, sk, ld, ty, tx, qk);
    tiled_dots(sdo, sv, ld, ty, tx, dp);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t t = t0 + 4 * ty + i, key = k0 + tx + 16 * j;
        float ds = 0.0f;
        if (tiled_visible(p, seg, 4 * ty + i < tb.rows && tx + 16 * j < nk, t, key)) {
          float pr, z;
          recompute(p, qk[i][j], slse[4 * ty + i], b, h, t, key, pr, z);
          ds = p.scale * pr * (dp[i][j] * z - sdelta[4 * ty + i]);
        }
        sds[(4 * ty + i) * kTiledLdS + tx + 16 * j] = ds;
      }
    __syncthreads();
    tiled_accumulate<kDv>(sds, sk, ld, ty, tx, dq);
  }
  const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  tiled_store<Io, kDv>(p.dq, p.dt_dq, tiled_rows(p.dq_rows, b, t0, h), tb.rows, D, ty, tx, dq, one);
}

}  // namespace loom::kernels::cuda::attn
