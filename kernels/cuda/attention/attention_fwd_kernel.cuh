// The tensor-core kernel of attention_fwd; the algorithm, launch geometry and shared-memory
// budget are described in attention_fwd.cu, which instantiates and launches it.
#pragma once

#include "kernels/cuda/attention/attention_device.cuh"
#include "kernels/cuda/attention/attention_params.cuh"

namespace loom::kernels::cuda::attn {

// Tile geometry of the forward kernel.
template <int D, int kWarps, int kBc>
struct FwdTile {
  static constexpr int kBr = 16 * kWarps;  // query rows per block
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLd = D + 8;  // padded row of a shared tile, in elements
  static_assert(D % 16 == 0 && kBc % 16 == 0, "mma tiles are 16 deep");
  template <class T>
  static constexpr size_t smem_bytes() {
    return sizeof(T) * static_cast<size_t>(kBr + 4 * kBc) * kLd + sizeof(int32_t) * 2 * kBc;
  }
};

template <class T, int D, int kWarps, int kBc>
__global__ void __launch_bounds__(32 * kWarps) attention_fwd_tc_kernel(const AttentionParams p) {
  using Tile = FwdTile<D, kWarps, kBc>;
  constexpr int kBr = Tile::kBr, kLd = Tile::kLd;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);                              // (kBr, kLd)
  T* sk = sq + kBr * kLd;                                          // (2, kBc, kLd)
  T* sv = sk + 2 * kBc * kLd;                                      // (2, kBc, kLd)
  int32_t* sseg = reinterpret_cast<int32_t*>(sv + 2 * kBc * kLd);  // (2, kBc)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int64_t T_ = p.t, S_ = p.s, H_ = p.h;
  const int64_t bh_count = p.b * H_;
  const int64_t m_tiles = (T_ + kBr - 1) / kBr;
  const int64_t block = blockIdx.x;
  const int64_t m_tile = m_tiles - 1 - block / bh_count;
  const int64_t bh = block % bh_count, b = bh / H_, h = bh % H_, g = h / p.group;
  const int64_t m0 = m_tile * kBr;

  // Row 0 of this (b, h) in Q and of (b, g) in K and V; row t (s) is t (s) row strides on.
  const T* q_base = static_cast<const T*>(p.q) + p.q_rows.at(b, 0, h);
  const T* k_base = static_cast<const T*>(p.k) + p.k_rows.at(b, 0, g);
  const T* v_base = static_cast<const T*>(p.v) + p.v_rows.at(b, 0, g);
  const int32_t* seg_row = p.seg != nullptr ? p.seg + b * T_ : nullptr;    // queries
  const int32_t* kseg_row = p.seg != nullptr ? p.kseg + b * S_ : nullptr;  // keys

  // Keys [0, n_end) are visible to some row of this block.
  const int64_t t_last = min64(m0 + kBr, T_) - 1;
  int64_t n_end = p.causal ? min64(S_, t_last + (S_ - T_) + 1) : S_;
  if (n_end < 0) n_end = 0;
  const int n_tiles = static_cast<int>((n_end + kBc - 1) / kBc);

  auto load_kv = [&](int j, int stage) {
    int64_t n0 = static_cast<int64_t>(j) * kBc;
    load_tile_async<T, D, kBc, Tile::kThreads>(sk + stage * kBc * kLd, k_base, n0, S_, p.k_rows.t_);
    load_tile_async<T, D, kBc, Tile::kThreads>(sv + stage * kBc * kLd, v_base, n0, S_, p.v_rows.t_);
    if (seg_row != nullptr)
      for (int i = threadIdx.x; i < kBc; i += Tile::kThreads)
        sseg[stage * kBc + i] = n0 + i < S_ ? kseg_row[n0 + i] : 0;
  };

  load_tile_async<T, D, kBr, Tile::kThreads>(sq, q_base, m0, T_, p.q_rows.t_);
  if (n_tiles > 0) load_kv(0, 0);
  cp_async_commit();

  // This lane's two rows of the warp's 16: gid and gid + 8.
  const int64_t t0 = m0 + warp * 16 + gid, t1 = t0 + 8;
  const int32_t seg0 = seg_row != nullptr && t0 < T_ ? seg_row[t0] : 0;
  const int32_t seg1 = seg_row != nullptr && t1 < T_ ? seg_row[t1] : 0;
  const float scale_log2 = p.scale * kLog2e;
  const int mi = lane / 8, mr = lane % 8;  // ldmatrix: which matrix this lane addresses, row

  uint32_t qf[D / 16][4];  // A fragments of the warp's Q rows
  float acc[D / 8][4];     // (16, D) output accumulator
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // log2 domain
  float row_sum[2] = {0.0f, 0.0f};            // this lane's share; quad-summed at the end

  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j & 1;
    const int64_t n0 = static_cast<int64_t>(j) * kBc;
    cp_async_wait_all();
    __syncthreads();  // tile j landed for all threads; everyone is done with tile j - 1
    if (j + 1 < n_tiles) load_kv(j + 1, stage ^ 1);
    cp_async_commit();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], sq + (warp * 16 + mr + (mi & 1) * 8) * kLd + kk * 16 + (mi >> 1) * 8);
    }

    // S = Q K^T: (16, kBc) per warp.
    const T* kt = sk + stage * kBc * kLd;
    float s[kBc / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int nt = 0; nt < kBc / 8; nt += 2) {
        uint32_t bf[4];
        ldmatrix_x4(bf, kt + (nt * 8 + (mi >> 1) * 8 + mr) * kLd + kk * 16 + (mi & 1) * 8);
        mma_16816<T>(s[nt], qf[kk], bf[0], bf[1]);
        mma_16816<T>(s[nt + 1], qf[kk], bf[2], bf[3]);
      }

    // Scale into the log2 domain and mask.
    const int64_t w0 = m0 + warp * 16;  // the warp's first row
    const bool need_mask =
        n0 + kBc > S_ || seg_row != nullptr || (p.causal && n0 + kBc - 1 > w0 + (S_ - T_));
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * scale_log2;
        if (need_mask) {
          const int col = nt * 8 + 2 * tig + (e & 1);
          const int64_t key = n0 + col, row = e < 2 ? t0 : t1;
          bool hidden = key >= S_ || causal_hidden(p.causal, row, key, T_, S_) ||
                        (seg_row != nullptr && sseg[stage * kBc + col] != (e < 2 ? seg0 : seg1));
          if (hidden) x = -INFINITY;
        }
        s[nt][e] = x;
      }

    // Online softmax: new row max, rescale of the running sum and the accumulator.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s[nt][0], s[nt][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s[nt][2], s[nt][3]));
    }
    float shift[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m_new = fmaxf(row_max[r], quad_max(tile_max[r]));
      // A row that has seen only hidden keys keeps m = -inf; shifting by 0 then gives
      // p = 0 (never -inf - -inf = NaN) and corr = 0 on an accumulator that is still 0.
      shift[r] = m_new == -INFINITY ? 0.0f : m_new;
      corr[r] = exp2f(row_max[r] - shift[r]);
      row_max[r] = m_new;
      row_sum[r] *= corr[r];
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      acc[dt][0] *= corr[0], acc[dt][1] *= corr[0];
      acc[dt][2] *= corr[1], acc[dt][3] *= corr[1];
    }
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - shift[e / 2]);
        row_sum[e / 2] += s[nt][e];
      }

    if (p.dropout) {
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          if (s[nt][e] == 0.0f && s[nt][e + 1] == 0.0f) continue;  // hidden: nothing to drop
          const int64_t row = e < 2 ? t0 : t1;
          const int64_t key = n0 + nt * 8 + 2 * tig;
          const uint64_t index = dropout_index(p, b, h, row, key);
          float k0, k1;
          dropout_mult2(p.key, p.counter, index, p.threshold, p.keep_scale, k0, k1);
          s[nt][e] *= k0;
          s[nt][e + 1] *= k1;
        }
    }

    // O += P V: P (16, kBc) from registers, V (kBc, D) through ldmatrix.trans.
    const T* vt = sv + stage * kBc * kLd;
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                       pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, vt + (kk * 16 + (mi & 1) * 8 + mr) * kLd + dt * 8 + (mi >> 1) * 8);
        mma_16816<T>(acc[dt], a, bf[0], bf[1]);
        mma_16816<T>(acc[dt + 1], a, bf[2], bf[3]);
      }
    }
  }
  cp_async_wait_all();  // nothing may stay in flight into shared memory at exit

  // O = acc / l and lse, rows t0 and t1 of this lane.
  T* o_base = static_cast<T*>(p.o) + (b * T_ * H_ + h) * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = r == 0 ? t0 : t1;
    const float l = quad_sum(row_sum[r]);  // every lane takes part in the shuffle
    if (row >= T_) continue;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    uint32_t* dst = reinterpret_cast<uint32_t*>(o_base + row * H_ * D);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      dst[(dt * 8 + 2 * tig) / 2] = pack2<T>(acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv);
    if (tig == 0)
      p.lse[(b * H_ + h) * T_ + row] = l > 0.0f ? (row_max[r] + log2f(l)) * kLn2 : -INFINITY;
  }
}

}  // namespace loom::kernels::cuda::attn
