// The generic attention kernels (CUDA cores, any float dtypes, any head dim up to
// kAttentionGenericMaxD); the algorithm and launch geometry are described in
// attention_generic.cu, which instantiates and launches them.
#pragma once

#include "kernels/cuda/attention/attention_device.cuh"
#include "kernels/cuda/attention/attention_params.cuh"

namespace loom::kernels::cuda::attn {

// Query t's segment differs from key s's (only with segment ids; kseg_row: the keys' ids).
__device__ __forceinline__ bool other_segment(const int32_t* seg_row, const int32_t* kseg_row,
                                              int64_t t, int64_t s) {
  return seg_row != nullptr && seg_row[t] != kseg_row[s];
}

// The staging tile of a warp: up to 32 rows (one chunk of keys or queries) by kStageCols
// columns, padded to kStageLd so that lane j reading row j hits bank (j + d) % 32.
inline constexpr int kStageCols = 64;
inline constexpr int kStageLd = kStageCols + 1;
inline constexpr int64_t kStageFloats = 32 * kStageLd;

// Shared floats per warp of each kernel (the launchers in attention_generic.cu size with
// these): the kernel's own rows and scalars, then the staging tile.
__host__ __device__ constexpr int64_t generic_fwd_floats(int64_t d) {
  return 2 * d + 32 + kStageFloats;
}
__host__ __device__ constexpr int64_t generic_dkv_floats(int64_t d) {
  return 4 * d + 64 + kStageFloats;
}
__host__ __device__ constexpr int64_t generic_dq_floats(int64_t d) {
  return 3 * d + 32 + kStageFloats;
}

// Lane j's dot product of row j of a chunk of n <= 32 rows (row j's first element at index
// row_of(j) of src) with vec (D floats in shared memory), summed over d in order. The whole
// warp stages the rows kStageCols columns at a time, consecutive lanes on consecutive
// columns of a row (coalesced), then each lane reads its own row from shared memory: a lane
// reading its row straight from global memory made 32 transactions of every warp load.
// Every lane of the warp must call it; lanes >= n get 0.
template <class Io, class RowOf>
__device__ __forceinline__ float staged_dot(const void* src, DType dt, RowOf row_of, int n,
                                            const float* vec, int64_t D, float* stage, int lane) {
  float dot = 0.0f;
  for (int64_t d0 = 0; d0 < D; d0 += kStageCols) {
    const int dc = static_cast<int>(min64(kStageCols, D - d0));
    __syncwarp();  // every lane is done with the stage's previous contents
#pragma unroll 4
    for (int j = 0; j < n; ++j) {  // unrolled: several rows' loads in flight at once
      const int64_t base = row_of(j) + d0;
      for (int d = lane; d < dc; d += 32) stage[j * kStageLd + d] = Io::load(src, dt, base + d);
    }
    __syncwarp();
    if (lane < n)
      for (int d = 0; d < dc; ++d) dot += vec[d0 + d] * stage[lane * kStageLd + d];
  }
  return dot;
}

// Forward: warp per query row r = (b, h, t) of the (B, H, T) lse. Shared per warp:
// q (D), acc (D), p (32) floats, the staging tile.
template <class Io>
__global__ void attention_fwd_generic_kernel(const AttentionParams p) {
  extern __shared__ float shared[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t D = p.d, rows = p.b * p.h * p.t;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (r >= rows) return;  // whole warps leave together; no block barriers below
  float* sq = shared + warp * generic_fwd_floats(D);
  float* sacc = sq + D;
  float* sp = sacc + D;
  float* stage = sp + 32;
  const int64_t b = r / (p.h * p.t), h = (r / p.t) % p.h, t = r % p.t, g = h / p.group;
  // Q, K, V are views (their row strides), O is packed. Row offsets are computed whole where
  // used: a running row (k_row0 + j k_stride) cost the forward 32 more registers.
  const int64_t q_row = p.q_rows.at(b, t, h), o_row = ((b * p.t + t) * p.h + h) * D;
  const int32_t* seg_row = p.seg != nullptr ? p.seg + b * p.t : nullptr;
  const int32_t* kseg_row = p.seg != nullptr ? p.kseg + b * p.s : nullptr;
  const float scale_log2 = p.scale * kLog2e;
  for (int64_t d = lane; d < D; d += 32) {
    sq[d] = Io::load(p.q, p.dt_q, q_row + d);
    sacc[d] = 0.0f;
  }
  __syncwarp();

  int64_t limit = p.causal ? min64(p.s, t + p.s - p.t + 1) : p.s;
  float m = -INFINITY, l = 0.0f;  // running max (log2 domain), sum; equal in every lane
  for (int64_t k0 = 0; k0 < limit; k0 += 32) {
    const int64_t key = k0 + lane;
    const int n = static_cast<int>(min64(32, limit - k0));
    const float dot = staged_dot<Io>(
        p.k, p.dt_k, [&](int j) { return p.k_rows.at(b, k0 + j, g); }, n, sq, D, stage, lane);
    float x = -INFINITY;
    if (key < limit && !other_segment(seg_row, kseg_row, t, key)) x = dot * scale_log2;
    const float m_new = fmaxf(m, warp_max(x));
    const float shift = m_new == -INFINITY ? 0.0f : m_new;  // see attention_fwd.cu
    const float corr = exp2f(m - shift);
    float pr = exp2f(x - shift);
    l = l * corr + warp_sum(pr);
    m = m_new;
    if (p.dropout && pr != 0.0f)
      pr *=
          dropout_mult(p.key, p.counter, dropout_index(p, b, h, t, key), p.threshold, p.keep_scale);
    sp[lane] = pr;
    __syncwarp();
    for (int64_t d = lane; d < D; d += 32) {
      float a = sacc[d] * corr;
      // Each row j < n exists, so its load need not wait for the test of its weight: unrolled,
      // eight loads are in flight together (the kernels are latency-bound; H200 profile).
#pragma unroll 8
      for (int j = 0; j < n; ++j) {
        const float v = Io::load(p.v, p.dt_v, p.v_rows.at(b, k0 + j, g) + d);
        if (sp[j] != 0.0f) a += sp[j] * v;
      }
      sacc[d] = a;
    }
    __syncwarp();  // sp is rewritten by the next chunk
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = lane; d < D; d += 32) Io::store(p.o, p.dt_o, o_row + d, sacc[d] * inv);
  if (lane == 0) p.lse[r] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

// Probability (pr) and dropout multiplier (z) of (b, h, t, key) from the saved lse; the
// caller has checked that the pair is visible. qk is the raw dot product q . k.
__device__ __forceinline__ void recompute(const AttentionParams& p, float qk, float lse, int64_t b,
                                          int64_t h, int64_t t, int64_t key, float& pr, float& z) {
  pr = lse == -INFINITY ? 0.0f : exp2f(qk * p.scale * kLog2e - lse * kLog2e);
  z = 1.0f;
  if (p.dropout && pr != 0.0f)
    z = dropout_mult(p.key, p.counter, dropout_index(p, b, h, t, key), p.threshold, p.keep_scale);
}

// Backward pass 1: warp per key row r = (b, s, g) of the (B, S, G, D) dK / dV. Shared per
// warp: k, v, dk, dv (D each), pz, ds (32 each) floats, the staging tile.
template <class Io>
__global__ void attention_bwd_dkv_generic_kernel(const AttentionParams p) {
  extern __shared__ float shared[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t D = p.d, rows = p.b * p.s * p.g;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (r >= rows) return;
  float* sk = shared + warp * generic_dkv_floats(D);
  float* sv = sk + D;
  float* sdk = sv + D;
  float* sdv = sdk + D;
  float* spz = sdv + D;
  float* sds = spz + 32;
  float* stage = sds + 32;
  const int64_t b = r / (p.s * p.g), key = (r / p.g) % p.s, g = r % p.g;
  const int32_t* seg_row = p.seg != nullptr ? p.seg + b * p.t : nullptr;
  const int32_t* kseg_row = p.seg != nullptr ? p.kseg + b * p.s : nullptr;
  const int64_t k_row = p.k_rows.at(b, key, g), v_row = p.v_rows.at(b, key, g);
  for (int64_t d = lane; d < D; d += 32) {
    sk[d] = Io::load(p.k, p.dt_k, k_row + d);
    sv[d] = Io::load(p.v, p.dt_v, v_row + d);
    sdk[d] = sdv[d] = 0.0f;
  }
  __syncwarp();

  // Queries that see this key: t >= key - (S - T) under the causal mask.
  const int64_t t_begin = p.causal ? max64(0, key - (p.s - p.t)) : 0;
  for (int64_t h = g * p.group; h < (g + 1) * p.group; ++h)
    for (int64_t t0 = t_begin; t0 < p.t; t0 += 32) {
      const int64_t t = t0 + lane;
      const int n = static_cast<int>(min64(32, p.t - t0));
      // Query t0 + j's rows of Q (a view) and dO (packed, as O).
      auto q_row_of = [&](int j) { return p.q_rows.at(b, t0 + j, h); };
      auto do_row_of = [&](int j) { return ((b * p.t + t0 + j) * p.h + h) * D; };
      const float qk = staged_dot<Io>(p.q, p.dt_q, q_row_of, n, sk, D, stage, lane);
      const float dp = staged_dot<Io>(p.dout, p.dt_do, do_row_of, n, sv, D, stage, lane);
      float pz = 0.0f, ds = 0.0f;
      if (t < p.t && !other_segment(seg_row, kseg_row, t, key)) {
        float pr, z;
        recompute(p, qk, p.lse_in[(b * p.h + h) * p.t + t], b, h, t, key, pr, z);
        pz = pr * z;
        ds = p.scale * pr * (dp * z - p.delta[(b * p.h + h) * p.t + t]);
      }
      spz[lane] = pz;
      sds[lane] = ds;
      __syncwarp();
      for (int64_t d = lane; d < D; d += 32) {
        float ak = sdk[d], av = sdv[d];
#pragma unroll 8
        for (int j = 0; j < n; ++j) {  // loads before the test, as in the forward
          const float q = Io::load(p.q, p.dt_q, q_row_of(j) + d);
          const float dout = Io::load(p.dout, p.dt_do, do_row_of(j) + d);
          if (spz[j] == 0.0f && sds[j] == 0.0f) continue;
          ak += sds[j] * q;
          av += spz[j] * dout;
        }
        sdk[d] = ak;
        sdv[d] = av;
      }
      __syncwarp();
    }
  const int64_t dk_row = p.dk_rows.at(b, key, g), dv_row = p.dv_rows.at(b, key, g);
  for (int64_t d = lane; d < D; d += 32) {
    Io::store(p.dk, p.dt_dk, dk_row + d, sdk[d]);
    Io::store(p.dv, p.dt_dv, dv_row + d, sdv[d]);
  }
}

// Backward pass 2: warp per query row r = (b, t, h) of the (B, T, H, D) dQ. Shared per
// warp: q, do, dq (D each), ds (32) floats, the staging tile.
template <class Io>
__global__ void attention_bwd_dq_generic_kernel(const AttentionParams p) {
  extern __shared__ float shared[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t D = p.d, rows = p.b * p.t * p.h;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (r >= rows) return;
  float* sq = shared + warp * generic_dq_floats(D);
  float* sdo = sq + D;
  float* sdq = sdo + D;
  float* sds = sdq + D;
  float* stage = sds + 32;
  const int64_t b = r / (p.t * p.h), t = (r / p.h) % p.t, h = r % p.h, g = h / p.group;
  const int32_t* seg_row = p.seg != nullptr ? p.seg + b * p.t : nullptr;
  const int32_t* kseg_row = p.seg != nullptr ? p.kseg + b * p.s : nullptr;
  const int64_t q_row = p.q_rows.at(b, t, h);  // dO's row is r D (packed)
  for (int64_t d = lane; d < D; d += 32) {
    sq[d] = Io::load(p.q, p.dt_q, q_row + d);
    sdo[d] = Io::load(p.dout, p.dt_do, r * D + d);
    sdq[d] = 0.0f;
  }
  __syncwarp();
  const float lse = p.lse_in[(b * p.h + h) * p.t + t];
  const float delta = p.delta[(b * p.h + h) * p.t + t];
  const int64_t limit = lse == -INFINITY ? 0 : (p.causal ? min64(p.s, t + p.s - p.t + 1) : p.s);
  for (int64_t k0 = 0; k0 < limit; k0 += 32) {
    const int64_t key = k0 + lane;
    const int n = static_cast<int>(min64(32, limit - k0));
    auto k_row_of = [&](int j) { return p.k_rows.at(b, k0 + j, g); };
    auto v_row_of = [&](int j) { return p.v_rows.at(b, k0 + j, g); };
    const float qk = staged_dot<Io>(p.k, p.dt_k, k_row_of, n, sq, D, stage, lane);
    const float dp = staged_dot<Io>(p.v, p.dt_v, v_row_of, n, sdo, D, stage, lane);
    float ds = 0.0f;
    if (key < limit && !other_segment(seg_row, kseg_row, t, key)) {
      float pr, z;
      recompute(p, qk, lse, b, h, t, key, pr, z);
      ds = p.scale * pr * (dp * z - delta);
    }
    sds[lane] = ds;
    __syncwarp();
    for (int64_t d = lane; d < D; d += 32) {
      float a = sdq[d];
#pragma unroll 8
      for (int j = 0; j < n; ++j) {  // loads before the test, as in the forward
        const float k = Io::load(p.k, p.dt_k, k_row_of(j) + d);
        if (sds[j] != 0.0f) a += sds[j] * k;
      }
      sdq[d] = a;
    }
    __syncwarp();
  }
  const int64_t dq_row = p.dq_rows.at(b, t, h);
  for (int64_t d = lane; d < D; d += 32) Io::store(p.dq, p.dt_dq, dq_row + d, sdq[d]);
}

}  // namespace loom::kernels::cuda::attn
