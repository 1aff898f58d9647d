// Device code of mla_qkv / mla_qkv_bwd / mla_out / mla_out_bwd (loom/ops/mla.h), kept apart
// from the launchers (mla.cu) so that it can be compiled as host C++ too. T is the storage
// type (float, __nv_bfloat16, __half); every output but dkpe is a copy of T values (bit
// exact), dkpe sums the heads in f32 in head order, as the CPU kernels do.
//
// One thread per output element, the grid striding: threads of a warp write consecutive
// channels of a (b, t, h) row, so stores are coalesced and loads are runs of a row.
#pragma once

#include <stdint.h>

#include "kernels/cuda/common/dtype.cuh"

namespace loom::kernels::cuda::mla {

inline constexpr int kMlaThreads = 256;

struct MlaArgs {
  const void* in[3];  // qkv: q, kv, kpe; qkv_bwd: dQ, dK, dV; out: O; out_bwd: dY
  void* out[3];       // qkv: Q, K, V; qkv_bwd: dq, dkv, dkpe; out: Y; out_bwd: dO
  int64_t rows;       // B * T * H
  int64_t h;          // H
  int64_t dn, dr, dv;
};

#define LOOM_MLA_GRID_STRIDE(i, total)                                                       \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (total); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Q, K, V (rows, D) from q (rows, dn + dr), kv (rows, dn + dv), kpe (rows / H, dr).
template <class T>
__global__ void __launch_bounds__(kMlaThreads) mla_qkv_kernel(MlaArgs a) {
  const int64_t d = a.dn + a.dr, dkv = a.dn + a.dv;
  const T* q = static_cast<const T*>(a.in[0]);
  const T* kv = static_cast<const T*>(a.in[1]);
  const T* kpe = static_cast<const T*>(a.in[2]);
  T *Q = static_cast<T*>(a.out[0]), *K = static_cast<T*>(a.out[1]), *V = static_cast<T*>(a.out[2]);
  LOOM_MLA_GRID_STRIDE(i, a.rows * d) {
    const int64_t r = i / d, e = i % d;
    const bool pe = e < a.dr;
    Q[i] = pe ? q[r * d + a.dn + e] : q[r * d + e - a.dr];
    K[i] = pe ? kpe[(r / a.h) * a.dr + e] : kv[r * dkv + e - a.dr];
    V[i] = e < a.dv ? kv[r * dkv + a.dn + e] : from_f32<T>(0.0f);
  }
}

// Channels per row of mla_qkv_bwd's threads: both dq's D and dkv's dn + dv (which exceeds D
// when dv > dr).
__host__ __device__ inline int64_t mla_qkv_bwd_width(int64_t dn, int64_t dr, int64_t dv) {
  return dn + dr > dn + dv ? dn + dr : dn + dv;
}

// dq (rows, D) and dkv (rows, dn + dv) from dQ, dK, dV (rows, D); dV's padding is not read.
// One thread per channel e < max(D, dn + dv) of a row.
template <class T>
__global__ void __launch_bounds__(kMlaThreads) mla_qkv_bwd_kernel(MlaArgs a) {
  const int64_t d = a.dn + a.dr, dkv = a.dn + a.dv, w = mla_qkv_bwd_width(a.dn, a.dr, a.dv);
  const T* dQ = static_cast<const T*>(a.in[0]);
  const T* dK = static_cast<const T*>(a.in[1]);
  const T* dV = static_cast<const T*>(a.in[2]);
  T *dq = static_cast<T*>(a.out[0]), *dkv_out = static_cast<T*>(a.out[1]);
  LOOM_MLA_GRID_STRIDE(i, a.rows * w) {
    const int64_t r = i / w, e = i % w;
    if (e < d) dq[r * d + e] = e < a.dn ? dQ[r * d + e + a.dr] : dQ[r * d + e - a.dn];
    if (e < dkv) dkv_out[r * dkv + e] = e < a.dn ? dK[r * d + e + a.dr] : dV[r * d + e - a.dn];
  }
}

// dkpe (rows / H, dr): the sum over heads of dK[.., h, 0 : dr], f32, in head order.
template <class T>
__global__ void __launch_bounds__(kMlaThreads) mla_dkpe_kernel(MlaArgs a) {
  const int64_t d = a.dn + a.dr;
  const T* dK = static_cast<const T*>(a.in[1]);
  T* dkpe = static_cast<T*>(a.out[2]);
  LOOM_MLA_GRID_STRIDE(i, (a.rows / a.h) * a.dr) {
    const int64_t bt = i / a.dr, j = i % a.dr;
    float acc = 0.0f;
    for (int64_t h = 0; h < a.h; ++h) acc += to_f32<T>(dK[(bt * a.h + h) * d + j]);
    dkpe[i] = from_f32<T>(acc);
  }
}

// Y (rows, dv) = O[:, 0 : dv].
template <class T>
__global__ void __launch_bounds__(kMlaThreads) mla_out_kernel(MlaArgs a) {
  const int64_t d = a.dn + a.dr;
  const T* O = static_cast<const T*>(a.in[0]);
  T* Y = static_cast<T*>(a.out[0]);
  LOOM_MLA_GRID_STRIDE(i, a.rows * a.dv) Y[i] = O[(i / a.dv) * d + i % a.dv];
}

// dO (rows, D) = [dY, 0].
template <class T>
__global__ void __launch_bounds__(kMlaThreads) mla_out_bwd_kernel(MlaArgs a) {
  const int64_t d = a.dn + a.dr;
  const T* dY = static_cast<const T*>(a.in[0]);
  T* dO = static_cast<T*>(a.out[0]);
  LOOM_MLA_GRID_STRIDE(i, a.rows * d) {
    const int64_t r = i / d, e = i % d;
    dO[i] = e < a.dv ? dY[r * a.dv + e] : from_f32<T>(0.0f);
  }
}

#undef LOOM_MLA_GRID_STRIDE

}  // namespace loom::kernels::cuda::mla
