// Device code of swiglu_fwd / swiglu_bwd (swiglu.cu has the ops' contract and the launches),
// and the host-side choice between its two kernels (swiglu_plan), in a header so that
// tests/kernels/cuda/pointwise_emulation runs both kernels on the CPU.
//
// X (N, 2F) holds the gate g = X[:, :F] then the up projection u = X[:, F:]; Y and dY are
// (N, F), dX (N, 2F). Both kernels compute in f32 with the same expressions,
//   forward   y = g / (1 + expf(-g)) * u
//   backward  s = 1 / (1 + expf(-g)), dg = dy * u * s * (1 + g (1 - s)), du = dy * g * s,
// so for one dtype they give the same bits (the emulation test checks it).
//
// - swiglu_typed_kernel<T, kVec>: X, dY and Y / dX all of storage type T (f32, bf16, f16).
//   One thread per chunk of W = 16 / sizeof(T) consecutive j of one row (4 f32, 8 bf16 /
//   f16); chunk q of the (N, cpr = ceil(F / W)) chunks is row q / cpr, chunk q % cpr of it,
//   one 32-bit division per chunk (the plan takes this kernel only below 2^31 chunks), with
//   64-bit element offsets. kVec (F % W == 0 and every base pointer 16-byte aligned, hence
//   every chunk): the chunk's gate, up, dY and output are each one 16-byte access; else
//   element by element, typed, up to the row's end. 256 threads a block, one chunk each, no
//   grid-stride loop (ceil(chunks / 256) < 2^23 blocks).
// - swiglu_kernel: the general one, any dtype mix (each tensor's dtype a run-time argument,
//   pointwise/device_util.cuh's load4 / store4): one thread per chunk of 4 j of one row (one
//   16- or 8-byte access when F % 4 == 0 and the tensors are 4-element aligned), 256 threads
//   a block, grid-striding with 64-bit indices over N * ceil(F / 4) chunks.
//
// In both, a thread reads its chunk's gate, up and dY before it writes the chunk's output,
// and no other thread touches those elements, so dX may alias X.
//
// Plain CUDA C++ without host-only code in the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <loom/kernel.h>
#include <stdint.h>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {

// ---- The general kernel ---------------------------------------------------------------------

// Forward when dy is null (out = Y (N, F)), else backward (out = dX (N, 2F)). x: (N, 2F).
__global__ void swiglu_kernel(const void* x, DType xt, const void* dy, DType dyt, void* out,
                              DType ot, int64_t rows, int64_t f, bool vec) {
  const int64_t per_row = (f + 3) / 4, chunks = rows * per_row;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < chunks;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = q / per_row, j = (q - n * per_row) * 4;
    const int64_t gate = n * 2 * f, up = gate + f;  // first element of each half of row n
    float g[4], u[4];
    load4(x, xt, gate + j, gate + f, vec, g);
    load4(x, xt, up + j, up + f, vec, u);
    if (dy == nullptr) {
#pragma unroll
      for (int e = 0; e < 4; ++e) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
      store4(out, ot, n * f + j, (n + 1) * f, vec, g);
    } else {
      float d[4];
      load4(dy, dyt, n * f + j, (n + 1) * f, vec, d);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = 1.0f / (1.0f + expf(-g[e]));
        float dgate = d[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
        u[e] = d[e] * g[e] * s;
        g[e] = dgate;
      }
      store4(out, ot, gate + j, gate + f, vec, g);
      store4(out, ot, up + j, up + f, vec, u);
    }
  }
}

// ---- The typed kernel -------------------------------------------------------------------------

template <class T>
struct SwigluTypedArgs {
  const T* x;        // (N, 2F)
  const T* dy;       // (N, F); null in the forward
  T* out;            // forward: Y (N, F); backward: dX (N, 2F)
  int64_t f;         // F
  uint32_t per_row;  // cpr = ceil(F / W) chunks a row
  uint32_t chunks;   // N * cpr < 2^31
};

// Elements of a typed chunk: one 16-byte access.
template <class T>
inline constexpr int kSwigluWidth = static_cast<int>(16 / sizeof(T));

template <class T, bool kVec>
__global__ void __launch_bounds__(kFlatThreads) swiglu_typed_kernel(SwigluTypedArgs<T> a) {
  constexpr int kW = kSwigluWidth<T>;
  const uint32_t q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= a.chunks) return;
  const uint32_t n = q / a.per_row, c = q - n * a.per_row;
  const int64_t j = static_cast<int64_t>(c) * kW;
  const int64_t gate = static_cast<int64_t>(n) * 2 * a.f + j, up = gate + a.f;  // in X / dX
  const int64_t yj = static_cast<int64_t>(n) * a.f + j;                         // in Y / dY
  // Elements of this chunk inside the row (kVec: all of them).
  const int m = kVec ? kW : static_cast<int>(a.f - j < kW ? a.f - j : kW);
  float g[kW], u[kW], d[kW];
  if constexpr (kVec) {
    load_pack<T, kW>(a.x + gate, g);
    load_pack<T, kW>(a.x + up, u);
    if (a.dy != nullptr) load_pack<T, kW>(a.dy + yj, d);
  } else {
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      g[e] = e < m ? to_f32<T>(a.x[gate + e]) : 0.0f;
      u[e] = e < m ? to_f32<T>(a.x[up + e]) : 0.0f;
      d[e] = e < m && a.dy != nullptr ? to_f32<T>(a.dy[yj + e]) : 0.0f;
    }
  }
  if (a.dy == nullptr) {
#pragma unroll
    for (int e = 0; e < kW; ++e) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
    if constexpr (kVec) {
      store_pack<T, kW>(a.out + yj, g);
    } else {
#pragma unroll
      for (int e = 0; e < kW; ++e)
        if (e < m) a.out[yj + e] = from_f32<T>(g[e]);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kW; ++e) {
    const float s = 1.0f / (1.0f + expf(-g[e]));
    const float dgate = d[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
    u[e] = d[e] * g[e] * s;
    g[e] = dgate;
  }
  if constexpr (kVec) {
    store_pack<T, kW>(a.out + gate, g);
    store_pack<T, kW>(a.out + up, u);
  } else {
#pragma unroll
    for (int e = 0; e < kW; ++e)
      if (e < m) {
        a.out[gate + e] = from_f32<T>(g[e]);
        a.out[up + e] = from_f32<T>(u[e]);
      }
  }
}

// ---- Which kernel (host) ----------------------------------------------------------------------

struct SwigluPlan {
  bool typed;      // swiglu_typed_kernel<T, vec>, T the common dtype; else swiglu_kernel
  bool vec;        // typed: 16-byte chunks; general: 4-element chunks
  int width;       // elements a chunk: 16 / dtype size (typed) or 4 (general)
  int64_t chunks;  // N * ceil(F / width)
};

// The kernel for X (N, 2F) and out (Y or dX) with dY (null in the forward): the typed one
// when every tensor has one dtype and there are fewer than 2^31 chunks, else the general.
inline SwigluPlan swiglu_plan(const void* x, DType xt, const void* dy, DType dyt, const void* out,
                              DType ot, int64_t n, int64_t f) {
  auto aligned = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;  // null (dY in the forward) counts
  };
  SwigluPlan p{};
  const bool one_dtype = xt == ot && (dy == nullptr || dyt == xt);
  if (one_dtype) {
    p.width = static_cast<int>(16 / dtype_size(xt));
    p.chunks = n * ((f + p.width - 1) / p.width);
    p.typed = p.chunks < (int64_t{1} << 31);
  }
  if (p.typed) {
    p.vec = f % p.width == 0 && aligned(x, 16) && aligned(dy, 16) && aligned(out, 16);
    return p;
  }
  const size_t e = dtype_size(xt);  // the general kernel's 4-element alignment, per tensor
  p.width = 4;
  p.chunks = n * ((f + 3) / 4);
  p.vec = f % 4 == 0 && aligned(x, 4 * e) && aligned(out, 4 * dtype_size(ot)) &&
          (dy == nullptr || aligned(dy, 4 * dtype_size(dyt)));
  return p;
}

// The typed kernel's arguments for a typed plan p over X (N, 2F), dY (null in the forward)
// and out; the blocks of its launch: swiglu_typed_blocks(p).
template <class T>
SwigluTypedArgs<T> swiglu_typed_args(const SwigluPlan& p, const void* x, const void* dy, void* out,
                                     int64_t f) {
  return {static_cast<const T*>(x),
          static_cast<const T*>(dy),
          static_cast<T*>(out),
          f,
          static_cast<uint32_t>((f + p.width - 1) / p.width),
          static_cast<uint32_t>(p.chunks)};
}
inline unsigned swiglu_typed_blocks(const SwigluPlan& p) {
  return static_cast<unsigned>((p.chunks + kFlatThreads - 1) / kFlatThreads);
}

}  // namespace loom::kernels::cuda::pointwise
