// Device code of rope_fwd / rope_bwd (rope.cu has the ops' contract and the launches), and
// the host-side choice between its two kernels (rope_plan), in a header so that
// tests/kernels/cuda/pointwise_emulation runs both on the CPU.
//
// X, Y (B, T, H, D), each with its own row strides (RopeStrides: views of a fused QKV
// projection rotated in place, or packed); in each head channel i < half = rotary_dim / 2 pairs
// with i + half and turns by the angle a = position * inv_freq[i] (backward: by -a); channels from
// 2 * half on pass through. Both kernels form a in f64 (the product the reference forms) and rotate
// in f32 with the same expressions, y1 = x1 c - x2 s, y2 = x2 c + x1 s (rope_y1, rope_y2: one
// rounded product and one fused multiply-add each); they differ in how they get c and s:
//
// - rope_kernel (general: X and Y of any dtypes, each switched at run time): sincos in f64,
//   rounded to f32 (error <= 2^-25 ~ 3e-8). Launch: the grid strides over the B * T tokens,
//   one token per block at a time; thread tid of the 256 is pair lane tid % lanes (lanes:
//   32..256, a power of two) and head row tid / lanes, striding over the half pair indices
//   and the H heads, so consecutive threads read consecutive channels of a head.
// - rope_typed_kernel<T, kW> (X and Y both of storage type T): rope_cos_sin reduces a to
//   r = a - 2 pi rint(a / 2 pi) in [-pi, pi] in f64 (2 pi in two parts: r is within ~1e-15
//   of the exact remainder for |a| < 2^31), then takes sincosf of r rounded to f32. Error
//   bound of c and s against cos a, sin a: 2^-23 from rounding r (|r| < 4) plus CUDA
//   sincosf's 2 ulp of a result <= 1 (2^-23): |error| <= 2^-22 ~ 2.4e-7, at any position
//   (an f32 angle would be off by up to position * 2^-24 radians). The rotated f32 output
//   is then within 2.4e-7 (|x1| + |x2|) + 2^-23 (|x1| + |x2|) ~ 3.6e-7 (|x1| + |x2|) of the
//   exact rotation of the stored inputs, before the rounding to T.
//   Launch: one thread per (token, group of kRopeHeads heads, vector of kW pair indices),
//   the vector fastest, 256 threads a block, one item a thread, 32-bit indices (the plan
//   takes this kernel only below 2^31 items). A thread takes the kW cosines and sines of
//   its vector once, loads both halves of its pairs in all its heads (kW = 16 / sizeof(T):
//   one 16-byte access each, when half and D are multiples of kW and X and Y 16-byte
//   aligned; else kW = 1), then rotates and stores them, and copies its share (channels
//   2 half + v, + vecs, ...) of the heads' passed-through channels unless Y is X.
//
// In both, a thread reads both channels of its pairs before writing them and no other
// thread touches them, and a passed-through channel is read and written by one thread, so
// Y may alias X.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <loom/kernel.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/rope_math.cuh"

namespace loom::kernels::cuda::pointwise {

// Row strides (elements) of X and Y: row (b, t, h) of X starts at b xb + t xt + h xh, its D
// channels packed (op_checks::RopeShape::x / y).
struct RopeStrides {
  int64_t xb, xt, xh, yb, yt, yh;
};
// Those of packed X and Y (B, T, H, D).
inline RopeStrides rope_packed_strides(int64_t t, int64_t h, int64_t d) {
  return {t * h * d, h * d, d, t * h * d, h * d, d};
}

// ---- The general kernel -----------------------------------------------------------------------

// x, y: (B * T = tokens, H, D) with row strides st; positions (tokens) or null (token % t);
// inv_freq (half). sign: 1 forward, -1 backward.
__global__ void rope_kernel(const void* x, DType xt, const int32_t* positions,
                            const float* inv_freq, void* y, DType yt, int64_t tokens, int64_t t,
                            int64_t h, int64_t d, int64_t half, double sign, int lanes,
                            RopeStrides st) {
  const int64_t rest = d - 2 * half;  // passed-through channels per head
  const int tid = threadIdx.x, threads = blockDim.x, rows = threads / lanes;
  const int lane = tid % lanes, row = tid / lanes;
  for (int64_t token = blockIdx.x; token < tokens; token += gridDim.x) {
    const double pos = positions != nullptr ? static_cast<double>(positions[token])
                                            : static_cast<double>(token % t);
    // Channel 0 of the token's head 0 in X and in Y.
    const int64_t x0 = token / t * st.xb + token % t * st.xt,
                  y0 = token / t * st.yb + token % t * st.yt;
    for (int64_t i = lane; i < half; i += lanes) {
      double s, c;
      sincos(pos * static_cast<double>(inv_freq[i]), &s, &c);
      const float cs = static_cast<float>(c), sn = static_cast<float>(sign * s);
      for (int64_t k = row; k < h; k += rows) {
        const int64_t e1 = x0 + k * st.xh + i, f1 = y0 + k * st.yh + i;
        const float x1 = load_elem(x, xt, e1), x2 = load_elem(x, xt, e1 + half);
        store_elem(y, yt, f1, rope_y1(x1, x2, cs, sn));
        store_elem(y, yt, f1 + half, rope_y2(x1, x2, cs, sn));
      }
    }
    if (rest > 0)
      for (int64_t j = tid; j < h * rest; j += threads) {
        const int64_t ch = 2 * half + j % rest;
        store_elem(y, yt, y0 + (j / rest) * st.yh + ch,
                   load_elem(x, xt, x0 + (j / rest) * st.xh + ch));
      }
  }
}

// ---- The typed kernel -------------------------------------------------------------------------

// Heads a thread of the typed kernel rotates (with one set of kW cosines and sines).
inline constexpr int kRopeHeads = 4;
// Pair indices a thread of the typed kernel takes when it moves 16 bytes at a time.
template <class T>
inline constexpr int kRopeWidth = static_cast<int>(16 / sizeof(T));

template <class T>
struct RopeTypedArgs {
  const T* x;                // (tokens, H, D)
  const int32_t* positions;  // (tokens) or null: token % t
  const float* inv_freq;     // (half)
  T* y;                      // (tokens, H, D); may be x
  int64_t d;                 // D
  RopeStrides st;            // row strides of x and y
  uint32_t t, h, half;       // T, H, rotary_dim / 2
  uint32_t vecs, groups;     // half / kW vectors; ceil(H / kRopeHeads) head groups
  uint32_t items;            // tokens * groups * vecs < 2^31
  float sign;                // 1 forward, -1 backward
};

template <class T, int kW>
__global__ void __launch_bounds__(kFlatThreads) rope_typed_kernel(RopeTypedArgs<T> a) {
  using P = Pack<T, kW>;
  const uint32_t q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= a.items) return;
  const uint32_t v = q % a.vecs, tg = q / a.vecs, grp = tg % a.groups, token = tg / a.groups;
  const double pos = a.positions != nullptr ? static_cast<double>(a.positions[token])
                                            : static_cast<double>(token % a.t);
  const uint32_t i0 = v * kW;  // first pair index of the vector
  float cs[kW], sn[kW];
#pragma unroll
  for (int e = 0; e < kW; ++e) {
    rope_cos_sin(pos, a.inv_freq[i0 + e], &cs[e], &sn[e]);
    sn[e] *= a.sign;
  }
  const uint32_t k0 = grp * kRopeHeads;
  const int nh = static_cast<int>(a.h - k0 < kRopeHeads ? a.h - k0 : kRopeHeads);
  const int64_t b = token / a.t, tt = token % a.t;
  const int64_t xbase = b * a.st.xb + tt * a.st.xt + k0 * a.st.xh;  // head k0's channel 0
  const int64_t ybase = b * a.st.yb + tt * a.st.yt + k0 * a.st.yh;
  // Every load before any store: several accesses in flight, and Y may be X.
  P p1[kRopeHeads], p2[kRopeHeads];
#pragma unroll
  for (int hh = 0; hh < kRopeHeads; ++hh)
    if (hh < nh) {
      const T* xh = a.x + xbase + hh * a.st.xh + i0;
      p1[hh] = *reinterpret_cast<const P*>(xh);
      p2[hh] = *reinterpret_cast<const P*>(xh + a.half);
    }
#pragma unroll
  for (int hh = 0; hh < kRopeHeads; ++hh)
    if (hh < nh) {
      P o1, o2;
#pragma unroll
      for (int e = 0; e < kW; ++e) {
        const float x1 = to_f32<T>(p1[hh].v[e]), x2 = to_f32<T>(p2[hh].v[e]);
        o1.v[e] = from_f32<T>(rope_y1(x1, x2, cs[e], sn[e]));
        o2.v[e] = from_f32<T>(rope_y2(x1, x2, cs[e], sn[e]));
      }
      T* yh = a.y + ybase + hh * a.st.yh + i0;
      *reinterpret_cast<P*>(yh) = o1;
      *reinterpret_cast<P*>(yh + a.half) = o2;
    }
  if (a.y != a.x)  // (Y is X or does not overlap it: op_checks::check_rope)
    for (int hh = 0; hh < nh; ++hh)
      for (int64_t ch = 2 * static_cast<int64_t>(a.half) + v; ch < a.d; ch += a.vecs)
        a.y[ybase + hh * a.st.yh + ch] = a.x[xbase + hh * a.st.xh + ch];
}

// ---- Which kernel (host) ----------------------------------------------------------------------

struct RopePlan {
  bool typed;       // rope_typed_kernel<T, width>; else rope_kernel
  int width;        // typed: pair indices a thread (16 / dtype size, or 1)
  uint32_t vecs;    // typed: half / width
  uint32_t groups;  // typed: ceil(H / kRopeHeads)
  int64_t items;    // typed: threads, tokens * groups * vecs
  int lanes;        // general: pair lanes of a block (32..256)
};

// The kernel for X, Y (tokens = B T, H, D) with half pairs a head and row strides st: the
// typed one when X and Y share a dtype, half > 0 and there are fewer than 2^31 items, else
// the general. 16-byte vectors when every row of X and Y starts 16-byte aligned (the
// pointers and the strides of the dimensions with more than one row) and half is a
// multiple of the vector.
inline RopePlan rope_plan(const void* x, DType xt, const void* y, DType yt, int64_t tokens,
                          int64_t t, int64_t h, int64_t d, int64_t half, const RopeStrides& st) {
  RopePlan p{};
  p.lanes = 32;
  while (p.lanes < 256 && p.lanes < half) p.lanes *= 2;
  if (xt != yt || half == 0) return p;
  const int w = static_cast<int>(16 / dtype_size(xt));
  const int64_t bs = t > 0 ? tokens / t : 0;
  auto rows_aligned = [&](int64_t sb, int64_t stt, int64_t sh) {
    return (bs <= 1 || sb % w == 0) && (t <= 1 || stt % w == 0) && (h <= 1 || sh % w == 0);
  };
  const bool vec = half % w == 0 && d % w == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 16 == 0 && rows_aligned(st.xb, st.xt, st.xh) &&
                   rows_aligned(st.yb, st.yt, st.yh);
  p.width = vec ? w : 1;
  const int64_t vecs = half / p.width, groups = (h + kRopeHeads - 1) / kRopeHeads;
  p.items = tokens * groups * vecs;
  p.typed = p.items < (int64_t{1} << 31);
  p.vecs = static_cast<uint32_t>(vecs);
  p.groups = static_cast<uint32_t>(groups);
  return p;
}

// The typed kernel's arguments for a typed plan p over X, Y (B T = tokens, H, D) with
// sequences of t tokens and half pairs a head; bwd turns by minus the angle. The blocks of
// its launch: rope_typed_blocks(p).
template <class T>
RopeTypedArgs<T> rope_typed_args(const RopePlan& p, const void* x, const int32_t* positions,
                                 const float* inv_freq, void* y, int64_t t, int64_t h, int64_t d,
                                 int64_t half, bool bwd, const RopeStrides& st) {
  return {static_cast<const T*>(x),
          positions,
          inv_freq,
          static_cast<T*>(y),
          d,
          st,
          static_cast<uint32_t>(t),
          static_cast<uint32_t>(h),
          static_cast<uint32_t>(half),
          p.vecs,
          p.groups,
          static_cast<uint32_t>(p.items),
          bwd ? -1.0f : 1.0f};
}
inline unsigned rope_typed_blocks(const RopePlan& p) {
  return static_cast<unsigned>((p.items + kFlatThreads - 1) / kFlatThreads);
}

}  // namespace loom::kernels::cuda::pointwise
