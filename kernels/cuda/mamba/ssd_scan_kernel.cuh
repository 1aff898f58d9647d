// Device code of ssd_scan / ssd_scan_bwd (loom/ops/mamba.h), apart from the launchers
// (ssd_scan.cu) so that tests/kernels/cuda/mamba_emulation can run it on the CPU. T is the
// storage type of xBC, dt_in, A_log, D, dt_bias, y, dy, dxBC and ddt_in; states and
// arithmetic are f32.
//
// Every row p of a head's state S (P, N) runs its own recurrence given dt, B and C, so a
// block owns a tile of kSsdTileP rows of one (b, h) and walks its chunks of L steps in order
// (forward) or in reverse (backward), the tile's state in shared memory. Within a chunk, with
// cum[t] = sum_{s <= t} dt[s] * A (the chunk's inclusive log decay, cum[-1] = 0):
//   y[t]  = exp(cum[t]) * S_in C[t] + sum_{s <= t} M[t, s] x[s] + D x[t],
//           M[t, s] = exp(cum[t] - cum[s]) * dt[s] * (B[s] . C[t])
//   S_out = exp(cum[L-1]) * S_in + sum_s exp(cum[L-1] - cum[s]) * dt[s] * x[s] B[s]^T
// (the SSD form: quadratic within the chunk, the state passed between chunks); the block
// computes M once per chunk for its rows.
//
// Backward, a chunk at a time from the last, with R = dL/dS_out (zero after the last chunk):
//   K[t, s] = exp(cum[t] - cum[s]) (B[s] . C[t]) (s <= t),  Q[t, s] = dy[t] . x[s] (the tile's
//   rows), dSB[s] = sum_{t >= s} K[t, s] dy[t] + exp(cum[L-1] - cum[s]) R B[s]  (= dS[s] B[s])
//   dx[s]  = D dy[s] + dt[s] dSB[s]
//   dB[s]  = dt[s] (sum_{t >= s} exp(cum[t] - cum[s]) Q[t, s] C[t] + exp(cum[L-1] - cum[s]) R^T
//   x[s]) dC[t]  = exp(cum[t]) S_in^T dy[t] + sum_{s <= t} exp(cum[t] - cum[s]) dt[s] Q[t, s] B[s]
//   ddt[s] = x[s] . dSB[s] + A * da[s],  dA += sum_s dt[s] da[s],  dD += sum dy . x
//   R      <- exp(cum[L-1]) R + sum_t exp(cum[t]) dy[t] C[t]^T
// where da[s] = sum_{t >= s} gcum[t] (in the chunk) and gcum, the gradient of cum, is
//   gcum[t] = dy[t] . exp(cum[t]) S_in C[t] + sum_{s <= t} w[t, s] - sum_{t' >= t} w[t', t]
//             - rbx[t] + (t = L - 1) (exp(cum[L-1]) <R, S_in> + sum_s rbx[s]),
//   w[t, s] = K[t, s] dt[s] Q[t, s],  rbx[s] = exp(cum[L-1] - cum[s]) dt[s] x[s] . R B[s].
// S_in of each chunk comes from a forward pass (the forward kernel with y absent) that
// stores them. dB, dC (summed over the heads of a group and the row tiles) and ddt (over the
// row tiles) go by atomicAdd to f32 accumulators that a last kernel rounds into dxBC and
// ddt_in, with softplus' and the ddt_bias sum.
#pragma once

#include <stdint.h>

#include "kernels/cuda/common/dtype.cuh"

namespace loom::kernels::cuda::mamba {

inline constexpr int kSsdThreads = 256;
inline constexpr int kSsdTileP = 16;  // state rows per block
inline constexpr int kSsdMaxChunk = 64;

struct SsdArgs {
  const void* xbc;      // (B, T, G, HG * P + 2N)
  const void* dt_in;    // (B, T, H)
  const void* a_log;    // (H)
  const void* d;        // (H) or null
  const void* dt_bias;  // (H) or null
  const float* init;    // (B, H, P, N) or null
  void* y;              // (B, T, H, P) or null: the state pass only
  float* fin;           // (B, H, P, N) or null (may be init)
  float* states;        // (B, H, chunks, P, N) or null: S_in of every chunk
  // Backward.
  const void* dy;  // (B, T, H, P)
  void* dxbc;      // (B, T, G, HG * P + 2N): the x part here, B and C by the finalize kernel
  float* dbc;      // (B, T, G, 2N) f32 accumulators, zeroed
  float* ddt;      // (B, T, H) f32 accumulator, zeroed
  void* ddt_in;    // (B, T, H)
  float* da_log;   // (H) +=
  float* dd;       // (H) += or null
  int64_t b, t, h, p, g, n, hg;
  int chunk, chunks, softplus;
};

// Offsets (floats) of the shared-memory arrays of a block, for chunk length L and a row tile
// of kSsdTileP rows; rows of N are padded to N + 1 (no bank conflicts down a column).
struct SsdSmem {
  int64_t ldn, b, c, m, q, x, dy, rb, dsb, yi, s, r, dt, cum, w, gc, v, rbx, red, total;
};

__host__ __device__ inline SsdSmem ssd_smem(int64_t L, int64_t n, bool bwd) {
  SsdSmem o{};
  const int64_t pt = kSsdTileP;
  o.ldn = n + 1;
  int64_t at = 0;
  auto take = [&](int64_t count) {
    const int64_t here = at;
    at += count;
    return here;
  };
  o.b = take(L * o.ldn);
  o.c = take(L * o.ldn);
  o.m = take(L * L);  // M forward, K backward
  o.x = take(L * pt);
  o.s = take(pt * o.ldn);  // S forward, S_in backward
  o.dt = take(L);
  o.cum = take(L);
  o.w = take(L);
  o.red = take(32);
  if (bwd) {
    o.q = take(L * L);
    o.dy = take(L * pt);
    o.rb = take(L * pt);
    o.dsb = take(L * pt);
    o.yi = take(L * pt);
    o.r = take(pt * o.ldn);
    o.gc = take(L);
    o.v = take(L);
    o.rbx = take(L);
  }
  o.total = at;
  return o;
}

// dt of step t after the bias and softplus; `raw` gets the pre-softplus value.
template <class T>
__device__ __forceinline__ float ssd_dt(const SsdArgs& a, int64_t b, int64_t t, int64_t h,
                                        float* raw) {
  float v = to_f32<T>(static_cast<const T*>(a.dt_in)[(b * a.t + t) * a.h + h]);
  if (a.dt_bias != nullptr) v += to_f32<T>(static_cast<const T*>(a.dt_bias)[h]);
  if (raw != nullptr) *raw = v;
  if (a.softplus && v <= 20.0f) v = log1pf(expf(v));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread calls it and
// gets the sum. `red` holds 32 floats of shared memory.
__device__ inline float ssd_block_sum(float v, float* red) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float sum = 0.0f;
  for (int k = 0; k < warps; ++k) sum += red[k];
  return sum;
}

// Loads chunk [c0, c0 + len) of B, C, x (the tile's rows) and dt, then cum and
// w[s] = exp(cum[len-1] - cum[s]) * dt[s]. Ends with a barrier.
template <class T>
__device__ void ssd_load_chunk(const SsdArgs& a, const SsdSmem& o, float* sm, int64_t b, int64_t h,
                               int64_t p0, int np, int64_t c0, int len, float A) {
  const T* xbc = static_cast<const T*>(a.xbc);
  const int64_t gw = a.hg * a.p + 2 * a.n, cc = a.g * gw, grp = h / a.hg;
  const int64_t xoff = grp * gw + (h % a.hg) * a.p + p0, boff = grp * gw + a.hg * a.p;
  for (int64_t i = threadIdx.x; i < len * a.n; i += blockDim.x) {
    const int64_t s = i / a.n, k = i % a.n;
    const T* row = xbc + (b * a.t + c0 + s) * cc + boff;
    sm[o.b + s * o.ldn + k] = to_f32<T>(row[k]);
    sm[o.c + s * o.ldn + k] = to_f32<T>(row[a.n + k]);
  }
  for (int64_t i = threadIdx.x; i < len * np; i += blockDim.x) {
    const int64_t s = i / np, q = i % np;
    sm[o.x + s * kSsdTileP + q] = to_f32<T>(xbc[(b * a.t + c0 + s) * cc + xoff + q]);
  }
  for (int s = threadIdx.x; s < len; s += blockDim.x)
    sm[o.dt + s] = ssd_dt<T>(a, b, c0 + s, h, nullptr);
  __syncthreads();
  if (threadIdx.x == 0) {
    float run = 0.0f;
    for (int s = 0; s < len; ++s) sm[o.cum + s] = run += sm[o.dt + s] * A;
    for (int s = 0; s < len; ++s) sm[o.w + s] = expf(run - sm[o.cum + s]) * sm[o.dt + s];
  }
  __syncthreads();
}

// Grid (ceil(P / kSsdTileP), H, B), kSsdThreads threads, ssd_smem(chunk, N, false).total
// floats of dynamic shared memory.
template <class T>
__global__ void __launch_bounds__(kSsdThreads) ssd_scan_fwd_kernel(SsdArgs a) {
  extern __shared__ float mamba_smem[];
  float* sm = mamba_smem;
  const SsdSmem o = ssd_smem(a.chunk, a.n, false);
  const int64_t h = blockIdx.y, b = blockIdx.z, p0 = static_cast<int64_t>(blockIdx.x) * kSsdTileP;
  const int np = static_cast<int>(a.p - p0 < kSsdTileP ? a.p - p0 : kSsdTileP);
  const float A = -expf(to_f32<T>(static_cast<const T*>(a.a_log)[h]));
  const float D = a.d != nullptr ? to_f32<T>(static_cast<const T*>(a.d)[h]) : 0.0f;
  const int64_t head = (b * a.h + h) * a.p;  // first state row of (b, h)
  for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x) {
    const int64_t q = i / a.n, k = i % a.n;
    sm[o.s + q * o.ldn + k] = a.init != nullptr ? a.init[(head + p0 + q) * a.n + k] : 0.0f;
  }
  for (int k = 0; k < a.chunks; ++k) {
    const int64_t c0 = static_cast<int64_t>(k) * a.chunk;
    const int len = static_cast<int>(a.t - c0 < a.chunk ? a.t - c0 : a.chunk);
    ssd_load_chunk<T>(a, o, sm, b, h, p0, np, c0, len, A);  // barriers: S is complete
    if (a.states != nullptr) {
      float* st = a.states + ((b * a.h + h) * a.chunks + k) * a.p * a.n;
      for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x) {
        const int64_t q = i / a.n, kk = i % a.n;
        st[(p0 + q) * a.n + kk] = sm[o.s + q * o.ldn + kk];
      }
    }
    if (a.y != nullptr) {
      for (int i = threadIdx.x; i < len * len; i += blockDim.x) {
        const int t = i / len, s = i % len;
        float v = 0.0f;
        if (s <= t) {
          for (int64_t kk = 0; kk < a.n; ++kk)
            v += sm[o.b + s * o.ldn + kk] * sm[o.c + t * o.ldn + kk];
          v *= expf(sm[o.cum + t] - sm[o.cum + s]) * sm[o.dt + s];
        }
        sm[o.m + t * len + s] = v;
      }
      __syncthreads();
      T* y = static_cast<T*>(a.y);
      for (int i = threadIdx.x; i < len * np; i += blockDim.x) {
        const int t = i / np, q = i % np;
        float inter = 0.0f;
        for (int64_t kk = 0; kk < a.n; ++kk)
          inter += sm[o.s + q * o.ldn + kk] * sm[o.c + t * o.ldn + kk];
        float v = expf(sm[o.cum + t]) * inter;
        for (int s = 0; s <= t; ++s) v += sm[o.m + t * len + s] * sm[o.x + s * kSsdTileP + q];
        v += D * sm[o.x + t * kSsdTileP + q];
        y[((b * a.t + c0 + t) * a.h + h) * a.p + p0 + q] = from_f32<T>(v);
      }
      __syncthreads();  // S read
    }
    const float decay = expf(sm[o.cum + len - 1]);
    for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x) {
      const int64_t q = i / a.n, kk = i % a.n;
      float v = decay * sm[o.s + q * o.ldn + kk];
      for (int s = 0; s < len; ++s)
        v += sm[o.w + s] * sm[o.x + s * kSsdTileP + q] * sm[o.b + s * o.ldn + kk];
      sm[o.s + q * o.ldn + kk] = v;
    }
    __syncthreads();
  }
  if (a.fin != nullptr)
    for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x) {
      const int64_t q = i / a.n, k = i % a.n;
      a.fin[(head + p0 + q) * a.n + k] = sm[o.s + q * o.ldn + k];
    }
}

// Grid (ceil(P / kSsdTileP), H, B), kSsdThreads threads, ssd_smem(chunk, N, true).total
// floats of dynamic shared memory; a.states filled by the forward kernel.
template <class T>
__global__ void __launch_bounds__(kSsdThreads) ssd_scan_bwd_kernel(SsdArgs a) {
  extern __shared__ float mamba_smem[];
  float* sm = mamba_smem;
  const SsdSmem o = ssd_smem(a.chunk, a.n, true);
  const int64_t h = blockIdx.y, b = blockIdx.z, p0 = static_cast<int64_t>(blockIdx.x) * kSsdTileP;
  const int np = static_cast<int>(a.p - p0 < kSsdTileP ? a.p - p0 : kSsdTileP);
  const float A = -expf(to_f32<T>(static_cast<const T*>(a.a_log)[h]));
  const float D = a.d != nullptr ? to_f32<T>(static_cast<const T*>(a.d)[h]) : 0.0f;
  const int64_t gw = a.hg * a.p + 2 * a.n, cc = a.g * gw, grp = h / a.hg;
  const int64_t xoff = grp * gw + (h % a.hg) * a.p + p0;
  const T* dyg = static_cast<const T*>(a.dy);
  const int tp = kSsdTileP;
  for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x)
    sm[o.r + (i / a.n) * o.ldn + i % a.n] = 0.0f;
  float dd = 0.0f, da_acc = 0.0f;  // this thread's parts of dD and of dA (thread 0)
  for (int k = a.chunks - 1; k >= 0; --k) {
    const int64_t c0 = static_cast<int64_t>(k) * a.chunk;
    const int len = static_cast<int>(a.t - c0 < a.chunk ? a.t - c0 : a.chunk);
    const float* st = a.states + ((b * a.h + h) * a.chunks + k) * a.p * a.n;
    for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x) {
      const int64_t q = i / a.n, kk = i % a.n;
      sm[o.s + q * o.ldn + kk] = st[(p0 + q) * a.n + kk];
    }
    for (int i = threadIdx.x; i < len * np; i += blockDim.x) {
      const int t = i / np, q = i % np;
      sm[o.dy + t * tp + q] = to_f32<T>(dyg[((b * a.t + c0 + t) * a.h + h) * a.p + p0 + q]);
    }
    ssd_load_chunk<T>(a, o, sm, b, h, p0, np, c0, len, A);  // barriers
    const float cum_end = sm[o.cum + len - 1];
    // K, Q (len x len); RB[s] = R B[s], Yi[t] = exp(cum[t]) S_in C[t] (len x np).
    for (int i = threadIdx.x; i < len * len; i += blockDim.x) {
      const int t = i / len, s = i % len;
      float kv = 0.0f, qv = 0.0f;
      if (s <= t) {
        for (int64_t kk = 0; kk < a.n; ++kk)
          kv += sm[o.b + s * o.ldn + kk] * sm[o.c + t * o.ldn + kk];
        kv *= expf(sm[o.cum + t] - sm[o.cum + s]);
      }
      for (int q = 0; q < np; ++q) qv += sm[o.dy + t * tp + q] * sm[o.x + s * tp + q];
      sm[o.m + t * len + s] = kv;
      sm[o.q + t * len + s] = qv;
    }
    for (int i = threadIdx.x; i < len * np; i += blockDim.x) {
      const int t = i / np, q = i % np;
      float rb = 0.0f, yi = 0.0f;
      for (int64_t kk = 0; kk < a.n; ++kk) {
        rb += sm[o.r + q * o.ldn + kk] * sm[o.b + t * o.ldn + kk];
        yi += sm[o.s + q * o.ldn + kk] * sm[o.c + t * o.ldn + kk];
      }
      sm[o.rb + t * tp + q] = rb;
      sm[o.yi + t * tp + q] = expf(sm[o.cum + t]) * yi;
    }
    __syncthreads();
    // dSB and dx (len x np).
    T* dxbc = static_cast<T*>(a.dxbc);
    for (int i = threadIdx.x; i < len * np; i += blockDim.x) {
      const int s = i / np, q = i % np;
      float v = expf(cum_end - sm[o.cum + s]) * sm[o.rb + s * tp + q];
      for (int t = s; t < len; ++t) v += sm[o.m + t * len + s] * sm[o.dy + t * tp + q];
      sm[o.dsb + s * tp + q] = v;
      const float dx = D * sm[o.dy + s * tp + q] + sm[o.dt + s] * v;
      dxbc[(b * a.t + c0 + s) * cc + xoff + q] = from_f32<T>(dx);
    }
    // dB and dC (len x N), this tile's part.
    float* dbc = a.dbc + ((b * a.t + c0) * a.g + grp) * 2 * a.n;
    for (int64_t i = threadIdx.x; i < len * a.n; i += blockDim.x) {
      const int s = static_cast<int>(i / a.n);
      const int64_t kk = i % a.n;
      const float cs = sm[o.cum + s];
      float db = 0.0f;
      for (int t = s; t < len; ++t)
        db += expf(sm[o.cum + t] - cs) * sm[o.q + t * len + s] * sm[o.c + t * o.ldn + kk];
      float rx = 0.0f, sdy = 0.0f;
      for (int q = 0; q < np; ++q) {
        rx += sm[o.r + q * o.ldn + kk] * sm[o.x + s * tp + q];
        sdy += sm[o.s + q * o.ldn + kk] * sm[o.dy + s * tp + q];
      }
      db = sm[o.dt + s] * (db + expf(cum_end - cs) * rx);
      // dC of step t = s.
      float dc = expf(cs) * sdy;
      for (int u = 0; u <= s; ++u)
        dc += expf(cs - sm[o.cum + u]) * sm[o.dt + u] * sm[o.q + s * len + u] *
              sm[o.b + u * o.ldn + kk];
      atomicAdd(dbc + s * a.g * 2 * a.n + kk, db);
      atomicAdd(dbc + s * a.g * 2 * a.n + a.n + kk, dc);
    }
    // <R, S_in> over the tile.
    float rs = 0.0f;
    for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x) {
      const int64_t q = i / a.n, kk = i % a.n;
      rs += sm[o.r + q * o.ldn + kk] * sm[o.s + q * o.ldn + kk];
    }
    rs = ssd_block_sum(rs, sm + o.red);  // barriers: dSB complete too
    // Per step: v = x . dSB, gcum's terms, dD.
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
      float v = 0.0f, gi = 0.0f, rbx = 0.0f, xdy = 0.0f;
      for (int q = 0; q < np; ++q) {
        const float x = sm[o.x + t * tp + q], dy = sm[o.dy + t * tp + q];
        v += x * sm[o.dsb + t * tp + q];
        gi += dy * sm[o.yi + t * tp + q];
        rbx += x * sm[o.rb + t * tp + q];
        xdy += x * dy;
      }
      rbx *= expf(cum_end - sm[o.cum + t]) * sm[o.dt + t];
      float row = 0.0f, col = 0.0f;
      for (int s = 0; s <= t; ++s)
        row += sm[o.m + t * len + s] * sm[o.dt + s] * sm[o.q + t * len + s];
      for (int u = t; u < len; ++u) col += sm[o.m + u * len + t] * sm[o.q + u * len + t];
      col *= sm[o.dt + t];
      sm[o.v + t] = v;
      sm[o.rbx + t] = rbx;
      sm[o.gc + t] = gi + row - col - rbx;
      dd += xdy;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float tail = expf(cum_end) * rs;
      for (int t = 0; t < len; ++t) tail += sm[o.rbx + t];
      sm[o.gc + len - 1] += tail;
      float da = 0.0f;
      float* ddt = a.ddt + (b * a.t + c0) * a.h + h;
      for (int t = len - 1; t >= 0; --t) {
        da += sm[o.gc + t];
        atomicAdd(ddt + t * a.h, sm[o.v + t] + A * da);
        da_acc += sm[o.dt + t] * da;
      }
    }
    // R <- exp(cum_end) R + sum_t exp(cum[t]) dy[t] C[t]^T (every read of R is done).
    const float decay = expf(cum_end);
    for (int64_t i = threadIdx.x; i < np * a.n; i += blockDim.x) {
      const int64_t q = i / a.n, kk = i % a.n;
      float v = decay * sm[o.r + q * o.ldn + kk];
      for (int t = 0; t < len; ++t)
        v += expf(sm[o.cum + t]) * sm[o.dy + t * tp + q] * sm[o.c + t * o.ldn + kk];
      sm[o.r + q * o.ldn + kk] = v;
    }
    __syncthreads();
  }
  dd = ssd_block_sum(dd, sm + o.red);
  if (threadIdx.x == 0) {
    atomicAdd(a.da_log + h, A * da_acc);
    if (a.dd != nullptr) atomicAdd(a.dd + h, dd);
  }
}

// dxBC's B and C parts and ddt_in from the f32 accumulators: one thread per (b, t, g, 2N)
// and per (b, t, h) element, grid-striding.
template <class T>
__global__ void __launch_bounds__(kSsdThreads) ssd_scan_bwd_finish_kernel(SsdArgs a) {
  const int64_t gw = a.hg * a.p + 2 * a.n;
  const int64_t nbc = a.b * a.t * a.g * 2 * a.n, ndt = a.b * a.t * a.h;
  T* dxbc = static_cast<T*>(a.dxbc);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nbc + ndt;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < nbc) {
      const int64_t row = i / (2 * a.n), k = i % (2 * a.n);  // row = (b * T + t) * G + g
      dxbc[row * gw + a.hg * a.p + k] = from_f32<T>(a.dbc[i]);
    } else {
      const int64_t j = i - nbc, h = j % a.h, bt = j / a.h;
      float raw;
      ssd_dt<T>(a, bt / a.t, bt % a.t, h, &raw);
      float g = a.ddt[j];
      if (a.softplus && raw <= 20.0f) g *= 1.0f / (1.0f + expf(-raw));
      a.ddt[j] = g;  // for the ddt_bias sum
      static_cast<T*>(a.ddt_in)[j] = from_f32<T>(g);
    }
  }
}

// ddt_bias[h] += sum over (b, t) of ddt_in[b, t, h] (f32, before rounding): one block per h.
__global__ void __launch_bounds__(kSsdThreads)
    ssd_scan_bias_grad_kernel(const float* ddt, int64_t rows, int64_t h, float* ddt_bias) {
  extern __shared__ float mamba_smem[];
  float v = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) v += ddt[r * h + blockIdx.x];
  v = ssd_block_sum(v, mamba_smem);
  if (threadIdx.x == 0) ddt_bias[blockIdx.x] += v;
}

}  // namespace loom::kernels::cuda::mamba
