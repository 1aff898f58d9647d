// rope's arithmetic on a device, shared by rope_kernel.cuh's kernels (rope_fwd / rope_bwd) and
// rope_fp8_kernel.cuh's fused backward (rope_fp8_bwd), so that they give the same bits: the cosine
// and sine of an angle (rope_cos_sin; rope_kernel.cuh's comment has its error bound) and the
// rotation of a pair (rope_y1, rope_y2). Plain CUDA C++ (the emulation tests compile it as host
// C++).
#pragma once

#include <math.h>

namespace loom::kernels::cuda::pointwise {

// 2 pi = kTwoPiHi + kTwoPiLo, kTwoPiHi the f64 nearest 2 pi.
inline constexpr double kTwoPiHi = 6.283185307179586232;
inline constexpr double kTwoPiLo = 2.4492935982947064e-16;
inline constexpr double kInvTwoPi = 0.15915494309189533577;

// c, s = cos a, sin a of a = pos * inv_freq (formed in f64), each within 2^-22
// rope_kernel.cuh's comment's bound).
__device__ __forceinline__ void rope_cos_sin(double pos, float inv_freq, float* c, float* s) {
  const double a = pos * static_cast<double>(inv_freq);
  const double k = rint(a * kInvTwoPi);
  const double r = fma(-k, kTwoPiLo, fma(-k, kTwoPiHi, a));  // a - 2 pi k, in [-pi, pi]
  sincosf(static_cast<float>(r), s, c);
}

// The rotation of a pair (x1, x2) = (channel i, channel i + half) by c = cos, s = sin of its
// angle: y1 = x1 c - x2 s, y2 = x2 c + x1 s, each as one product rounded to f32 and one fused
// multiply-add, written out so that no compiler contracts it another way: every kernel that
// rotates (rope_kernel.cuh's two, rope_fp8_kernel.cuh's fused backward, and their emulation on a
// CPU) gives the same bits from the same c and s.
__device__ __forceinline__ float rope_y1(float x1, float x2, float c, float s) {
  return fmaf(x1, c, -(x2 * s));
}
__device__ __forceinline__ float rope_y2(float x1, float x2, float c, float s) {
  return fmaf(x2, c, x1 * s);
}

}  // namespace loom::kernels::cuda::pointwise
