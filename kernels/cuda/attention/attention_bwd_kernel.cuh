// The kernels of attention_bwd's tensor-core path (and the delta kernel the generic path
// shares); the algorithm, launch geometry and shared-memory budget are described in
// attention_bwd.cu, which instantiates and launches them.
#pragma once

#include "kernels/cuda/attention/attention_device.cuh"
#include "kernels/cuda/attention/attention_params.cuh"

namespace loom::kernels::cuda::attn {

// ---- 1. delta = rowsum(dO * O), dq_acc = 0 ------------------------------------------------

// One warp per row r of the (B, T, H, D) tensors; delta is (B, H, T).
template <class Io>
__global__ void attention_bwd_delta_kernel(const AttentionParams p) {
  const int64_t rows = p.b * p.t * p.h;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;  // whole warps leave together
  float dot = 0.0f;
  for (int64_t i = lane; i < p.d; i += 32)
    dot += Io::load(p.dout, p.dt_do, r * p.d + i) * Io::load(p.out, p.dt_o, r * p.d + i);
  dot = warp_sum(dot);
  if (p.dq_acc != nullptr)
    for (int64_t i = lane; i < p.d; i += 32) p.dq_acc[r * p.d + i] = 0.0f;
  if (lane == 0) {
    const int64_t b = r / (p.t * p.h), t = (r / p.h) % p.t, h = r % p.h;
    p.delta[(b * p.h + h) * p.t + t] = dot;
  }
}

// ---- 2. dK, dV per key tile; dQ by atomics --------------------------------------------------

template <int D, int kWarps, int kBr>
struct BwdTile {
  static constexpr int kBc = 16 * kWarps;  // keys per block
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLd = D + 8;     // padded row of K, V, Q, dO tiles
  static constexpr int kLdS = kBr + 8;  // padded row of the dS^T tile
  // dQ = dS K: (kBr / 16) row strips of 16 queries, each split into kDqSplit column chunks
  // of kDqCols, one (strip, chunk) per warp.
  static constexpr int kDqStrips = kBr / 16;
  static constexpr int kDqSplit = kWarps / kDqStrips;
  static constexpr int kDqCols = D / kDqSplit;
  static_assert(kBr % 16 == 0 && D % 16 == 0, "mma tiles are 16 deep");
  static_assert(kWarps % kDqStrips == 0 && D % kDqSplit == 0 && kDqCols % 16 == 0,
                "the dQ work must split evenly over the warps");
  template <class T>
  static constexpr size_t smem_bytes() {
    return sizeof(T) *
               (static_cast<size_t>(2 * kBc + 4 * kBr) * kLd + static_cast<size_t>(kBc) * kLdS) +
           sizeof(float) * 3 * 2 * kBr;
  }
};

// f32 atomic add of two adjacent elements (8-byte aligned): one vector red on sm_90.
__device__ __forceinline__ void atomic_add2(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

template <class T, int D, int kWarps, int kBr>
__global__ void __launch_bounds__(32 * kWarps) attention_bwd_tc_kernel(const AttentionParams p) {
  using Tile = BwdTile<D, kWarps, kBr>;
  constexpr int kBc = Tile::kBc, kLd = Tile::kLd, kLdS = Tile::kLdS;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sk = reinterpret_cast<T*>(smem);                        // (kBc, kLd)
  T* sv = sk + kBc * kLd;                                    // (kBc, kLd)
  T* sq = sv + kBc * kLd;                                    // (2, kBr, kLd)
  T* sdo = sq + 2 * kBr * kLd;                               // (2, kBr, kLd)
  T* sds = sdo + 2 * kBr * kLd;                              // (kBc, kLdS): dS^T, keys by queries
  float* slse = reinterpret_cast<float*>(sds + kBc * kLdS);  // (2, kBr): lse log2e
  float* sdelta = slse + 2 * kBr;                            // (2, kBr)
  int32_t* sseg = reinterpret_cast<int32_t*>(sdelta + 2 * kBr);  // (2, kBr)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int mi = lane / 8, mr = lane % 8;  // ldmatrix: which matrix this lane addresses, row
  const int64_t T_ = p.t, S_ = p.s, H_ = p.h, G_ = p.g;
  const int64_t splits = p.head_splits > 1 ? p.head_splits : 1;
  const int64_t bgs_count = p.b * G_ * splits;
  const int64_t block = blockIdx.x;
  const int64_t n0 = block / bgs_count * kBc;
  const int64_t bgs = block % bgs_count, split = bgs % splits, bg = bgs / splits;
  const int64_t b = bg / G_, g = bg % G_;
  // This block's query heads: [h_first, h_first + h_count) of the group's.
  const int64_t split_heads = (p.group + splits - 1) / splits;
  const int64_t h_first = g * p.group + split * split_heads;
  const int64_t h_count = min64(split_heads, p.group - split * split_heads);

  // Row 0 of this (b, g) in K and V; row s is s row strides on.
  const T* k_base = static_cast<const T*>(p.k) + p.k_rows.at(b, 0, g);
  const T* v_base = static_cast<const T*>(p.v) + p.v_rows.at(b, 0, g);
  const int32_t* seg_row = p.seg != nullptr ? p.seg + b * T_ : nullptr;    // queries
  const int32_t* kseg_row = p.seg != nullptr ? p.kseg + b * S_ : nullptr;  // keys

  // Queries that can see some key of the tile: t >= n0 - (S - T) under the causal mask.
  const int64_t t_begin = p.causal ? max64(0, n0 - (S_ - T_)) : 0;
  const int64_t i_begin = t_begin / kBr;
  const int64_t i_count = t_begin < T_ ? (T_ + kBr - 1) / kBr - i_begin : 0;
  const int64_t steps = h_count * i_count;  // (query head, query tile) pairs

  // Step it covers query head h_first + it / i_count, query tile i_begin + it % i_count.
  auto load_step = [&](int64_t it, int stage) {
    const int64_t h = h_first + it / i_count;
    const int64_t m0 = (i_begin + it % i_count) * kBr;
    // Row (b, t = 0, h) of the view Q and of the packed (B, T, H, D) dO.
    load_tile_async<T, D, kBr, Tile::kThreads>(sq + stage * kBr * kLd,
                                               static_cast<const T*>(p.q) + p.q_rows.at(b, 0, h),
                                               m0, T_, p.q_rows.t_);
    load_tile_async<T, D, kBr, Tile::kThreads>(
        sdo + stage * kBr * kLd, static_cast<const T*>(p.dout) + (b * T_ * H_ + h) * D, m0, T_,
        H_ * D);
    for (int i = threadIdx.x; i < kBr; i += Tile::kThreads) {
      const int64_t t = m0 + i;
      float l2 = INFINITY, dl = 0.0f;  // rows beyond T: P = exp2(x - inf) = 0
      if (t < T_) {
        const float lse = p.lse_in[(b * H_ + h) * T_ + t];
        // A fully masked row (lse = -inf) has no probabilities: +inf gives P = 0.
        l2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
        dl = p.delta[(b * H_ + h) * T_ + t];
      }
      slse[stage * kBr + i] = l2;
      sdelta[stage * kBr + i] = dl;
      sseg[stage * kBr + i] = seg_row != nullptr && t < T_ ? seg_row[t] : 0;
    }
  };

  load_tile_async<T, D, kBc, Tile::kThreads>(sk, k_base, n0, S_, p.k_rows.t_);
  load_tile_async<T, D, kBc, Tile::kThreads>(sv, v_base, n0, S_, p.v_rows.t_);
  if (steps > 0) load_step(0, 0);
  cp_async_commit();

  // This lane's two keys of the warp's 16: gid and gid + 8.
  const int64_t s0 = n0 + warp * 16 + gid, s1 = s0 + 8;
  const int32_t segk0 = kseg_row != nullptr && s0 < S_ ? kseg_row[s0] : 0;
  const int32_t segk1 = kseg_row != nullptr && s1 < S_ ? kseg_row[s1] : 0;
  const float scale_log2 = p.scale * kLog2e;
  const int dq_strip = warp / Tile::kDqSplit, dq_col0 = (warp % Tile::kDqSplit) * Tile::kDqCols;

  float dk[D / 8][4], dv[D / 8][4];  // (16 keys, D) each
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  for (int64_t it = 0; it < steps; ++it) {
    const int stage = static_cast<int>(it & 1);
    const int64_t h = h_first + it / i_count;
    const int64_t m0 = (i_begin + it % i_count) * kBr;
    cp_async_wait_all();
    __syncthreads();  // step it landed; every warp is done with step it - 1 (and its dS^T)
    if (it + 1 < steps) load_step(it + 1, stage ^ 1);
    cp_async_commit();
    const T* qt = sq + stage * kBr * kLd;
    const T* do_tile = sdo + stage * kBr * kLd;
    const float* lse2 = slse + stage * kBr;
    const float* delta = sdelta + stage * kBr;
    const int32_t* segq = sseg + stage * kBr;

    // S^T = K Q^T and dP^T = V dO^T: (16 keys, kBr queries) per warp.
    float st[kBr / 8][4], dpt[kBr / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBr / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      const int a_off = (warp * 16 + mr + (mi & 1) * 8) * kLd + kk * 16 + (mi >> 1) * 8;
      ldmatrix_x4(ka, sk + a_off);
      ldmatrix_x4(va, sv + a_off);
#pragma unroll
      for (int nt = 0; nt < kBr / 8; nt += 2) {
        const int b_off = (nt * 8 + (mi >> 1) * 8 + mr) * kLd + kk * 16 + (mi & 1) * 8;
        uint32_t qb[4], db[4];
        ldmatrix_x4(qb, qt + b_off);
        ldmatrix_x4(db, do_tile + b_off);
        mma_16816<T>(st[nt], ka, qb[0], qb[1]);
        mma_16816<T>(st[nt + 1], ka, qb[2], qb[3]);
        mma_16816<T>(dpt[nt], va, db[0], db[1]);
        mma_16816<T>(dpt[nt + 1], va, db[2], db[3]);
      }
    }

    // P^T, its dropped-out copy (into st) and dS^T (into dpt).
    const int64_t wk0 = n0 + warp * 16;  // the warp's first key
    const bool need_mask = wk0 + 16 > S_ || m0 + kBr > T_ || seg_row != nullptr ||
                           (p.causal && wk0 + 15 > m0 + (S_ - T_));
#pragma unroll
    for (int nt = 0; nt < kBr / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * tig + (e & 1);  // query within the tile
        const int64_t key = e < 2 ? s0 : s1, t = m0 + col;
        bool hidden = false;
        if (need_mask)
          hidden = key >= S_ || t >= T_ || causal_hidden(p.causal, t, key, T_, S_) ||
                   (seg_row != nullptr && segq[col] != (e < 2 ? segk0 : segk1));
        const float pr = hidden ? 0.0f : exp2f(st[nt][e] * scale_log2 - lse2[col]);
        float z = 1.0f;
        if (p.dropout && pr != 0.0f)
          z = dropout_mult(p.key, p.counter, dropout_index(p, b, h, t, key), p.threshold,
                           p.keep_scale);
        st[nt][e] = pr * z;
        dpt[nt][e] = p.scale * pr * (dpt[nt][e] * z - delta[col]);
      }

      // dV += (P^T z) dO and dK += dS^T Q: A from registers, B = dO, Q via ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      uint32_t pa[4] = {pack2<T>(st[2 * kk][0], st[2 * kk][1]),
                        pack2<T>(st[2 * kk][2], st[2 * kk][3]),
                        pack2<T>(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                        pack2<T>(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      uint32_t da[4] = {pack2<T>(dpt[2 * kk][0], dpt[2 * kk][1]),
                        pack2<T>(dpt[2 * kk][2], dpt[2 * kk][3]),
                        pack2<T>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                        pack2<T>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        const int b_off = (kk * 16 + (mi & 1) * 8 + mr) * kLd + dt * 8 + (mi >> 1) * 8;
        uint32_t ob[4], qb[4];
        ldmatrix_x4_trans(ob, do_tile + b_off);
        ldmatrix_x4_trans(qb, qt + b_off);
        mma_16816<T>(dv[dt], pa, ob[0], ob[1]);
        mma_16816<T>(dv[dt + 1], pa, ob[2], ob[3]);
        mma_16816<T>(dk[dt], da, qb[0], qb[1]);
        mma_16816<T>(dk[dt + 1], da, qb[2], qb[3]);
      }
    }

    // dS^T to shared memory: keys (rows) of this warp, queries (columns) of the tile.
#pragma unroll
    for (int nt = 0; nt < kBr / 8; ++nt) {
      uint32_t* row0 =
          reinterpret_cast<uint32_t*>(sds + (warp * 16 + gid) * kLdS + nt * 8 + 2 * tig);
      uint32_t* row1 =
          reinterpret_cast<uint32_t*>(sds + (warp * 16 + gid + 8) * kLdS + nt * 8 + 2 * tig);
      *row0 = pack2<T>(dpt[nt][0], dpt[nt][1]);
      *row1 = pack2<T>(dpt[nt][2], dpt[nt][3]);
    }
    __syncthreads();

    // dQ (kBr, D) += dS (kBr, kBc) K (kBc, D): this warp's (16, kDqCols) piece. A = dS from
    // the transposed store (ldmatrix.trans), B = K (keys, D) through ldmatrix.trans.
    float dq[Tile::kDqCols / 8][4];
#pragma unroll
    for (int dt = 0; dt < Tile::kDqCols / 8; ++dt)
      dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4_trans(a,
                        sds + (kk * 16 + (mi >> 1) * 8 + mr) * kLdS + dq_strip * 16 + (mi & 1) * 8);
#pragma unroll
      for (int dt = 0; dt < Tile::kDqCols / 8; dt += 2) {
        uint32_t kb[4];
        ldmatrix_x4_trans(
            kb, sk + (kk * 16 + (mi & 1) * 8 + mr) * kLd + dq_col0 + dt * 8 + (mi >> 1) * 8);
        mma_16816<T>(dq[dt], a, kb[0], kb[1]);
        mma_16816<T>(dq[dt + 1], a, kb[2], kb[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t t = m0 + dq_strip * 16 + gid + 8 * r;
      if (t >= T_) continue;
      float* dst = p.dq_acc + ((b * T_ + t) * H_ + h) * D + dq_col0 + 2 * tig;
#pragma unroll
      for (int dt = 0; dt < Tile::kDqCols / 8; ++dt)
        atomic_add2(dst + dt * 8, dq[dt][2 * r], dq[dt][2 * r + 1]);
    }
  }
  cp_async_wait_all();  // nothing may stay in flight into shared memory at exit

  // dK, dV rows s0 and s1 (both already carry the softmax scale through dS): this split's
  // share in f32 when the heads are split, else the rows themselves.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = r == 0 ? s0 : s1;
    if (key >= S_) continue;
    if (splits > 1) {
      // dkv_acc is packed (B, S, G, D) per split and tensor, whatever dK and dV are.
      const int64_t n = p.b * S_ * G_ * D;  // elements of dK
      float* dk_acc = p.dkv_acc + split * 2 * n + ((b * S_ + key) * G_ + g) * D + 2 * tig;
      float* dv_acc = dk_acc + n;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<float2*>(dk_acc + dt * 8) = make_float2(dk[dt][2 * r], dk[dt][2 * r + 1]);
        *reinterpret_cast<float2*>(dv_acc + dt * 8) = make_float2(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
      continue;
    }
    uint32_t* dk_row =
        reinterpret_cast<uint32_t*>(static_cast<T*>(p.dk) + p.dk_rows.at(b, key, g) + 2 * tig);
    uint32_t* dv_row =
        reinterpret_cast<uint32_t*>(static_cast<T*>(p.dv) + p.dv_rows.at(b, key, g) + 2 * tig);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      dk_row[dt * 4] = pack2<T>(dk[dt][2 * r], dk[dt][2 * r + 1]);
      dv_row[dt * 4] = pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

// ---- 3. dQ = dq_acc in the storage dtype; dK, dV = the sum of their splits -----------------

// Both read packed f32 rows (the workspaces) and write rows of the views dQ, dK, dV (row
// strides multiples of 8 elements, as the tensor-core path requires), one warp per row and
// grid-stride over the rows: the row's offset in the view takes two divisions per row, not
// per element. Lane l covers the row's elements [kPer l, kPer l + kPer), kPer = D / 32, with
// one vector load and one vector store (8 or 16 bytes read, 4 or 8 written).

// kPer floats from src (aligned to kPer floats).
template <int kPer>
__device__ __forceinline__ void load_f32(const float* src, float (&x)[kPer]) {
  static_assert(kPer == 2 || kPer == 4, "D / 32 elements per lane: D in {64, 128}");
  if constexpr (kPer == 2) {
    const float2 v = *reinterpret_cast<const float2*>(src);
    x[0] = v.x, x[1] = v.y;
  } else {
    const float4 v = *reinterpret_cast<const float4*>(src);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  }
}

// kPer floats rounded to T into dst (aligned to kPer elements).
template <class T, int kPer>
__device__ __forceinline__ void store_rounded(T* dst, const float (&x)[kPer]) {
  if constexpr (kPer == 2)
    *reinterpret_cast<uint32_t*>(dst) = pack2<T>(x[0], x[1]);
  else
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(x[0], x[1]), pack2<T>(x[2], x[3]));
}

// dK row (b, s, g) = sum over splits sp of dkv_acc[sp][0] row (b, s, g), dV the same of
// dkv_acc[sp][1], in split order (deterministic).
template <class T, int D>
__global__ void attention_dkv_reduce_kernel(const AttentionParams p) {
  constexpr int kPer = D / 32;
  const int64_t rows = p.b * p.s * p.g, n = rows * D;  // n: elements of dK
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += warps) {
    const int64_t b = r / (p.s * p.g), s = (r / p.g) % p.s, g = r % p.g;
    float k[kPer] = {}, v[kPer] = {};
    for (int64_t sp = 0; sp < p.head_splits; ++sp) {
      float xk[kPer], xv[kPer];
      load_f32<kPer>(p.dkv_acc + 2 * sp * n + r * D + kPer * lane, xk);
      load_f32<kPer>(p.dkv_acc + (2 * sp + 1) * n + r * D + kPer * lane, xv);
#pragma unroll
      for (int e = 0; e < kPer; ++e) k[e] += xk[e], v[e] += xv[e];
    }
    store_rounded<T, kPer>(static_cast<T*>(p.dk) + p.dk_rows.at(b, s, g) + kPer * lane, k);
    store_rounded<T, kPer>(static_cast<T*>(p.dv) + p.dv_rows.at(b, s, g) + kPer * lane, v);
  }
}

// dQ row (b, t, h) = dq_acc row (b, t, h) rounded to T.
template <class T, int D>
__global__ void attention_dq_convert_kernel(const AttentionParams p) {
  constexpr int kPer = D / 32;
  const int64_t rows = p.b * p.t * p.h;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += warps) {
    const int64_t b = r / (p.t * p.h), t = (r / p.h) % p.t, h = r % p.h;
    float x[kPer];
    load_f32<kPer>(p.dq_acc + r * D + kPer * lane, x);
    store_rounded<T, kPer>(static_cast<T*>(p.dq) + p.dq_rows.at(b, t, h) + kPer * lane, x);
  }
}

}  // namespace loom::kernels::cuda::attn
