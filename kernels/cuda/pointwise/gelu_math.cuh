// GELU's arithmetic in f32, shared by gelu_fwd / gelu_bwd (gelu.cu) and the in-register
// 3xTF32 GEMM's epilogues (kernels/cuda/gemm/tf32x3_mma.cuh): gelu(x) = x Phi(x), exact (erf)
// or the tanh approximation, and its derivative.
//
// Exact: Phi(x) = erfc(-x / sqrt 2) / 2, which keeps its relative accuracy for negative x
// (1 + erf(x / sqrt 2) would cancel). Tanh variant: (1 + tanh u) / 2 = sigmoid(2u) =
// 1 / (1 + e), e = exp(-2u), and (1 - tanh^2 u) / 4 = sigmoid(2u) (1 - sigmoid(2u)) =
// 1 / (2 + e + 1/e): sums of positive terms, so neither cancels when tanh u nears -1 (the
// reference works in f64; f32 1 + tanh would lose every digit there), and e = 0 or inf give
// the right limits.
#pragma once

#include <math.h>

namespace loom::kernels::cuda::pointwise {

constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // the normal density at 0
constexpr float kCubic = 0.044715f;

// gelu(x); *dgelu = gelu'(x) when dgelu is not null.
__device__ __forceinline__ float gelu(float x, bool tanh_approx, float* dgelu) {
  if (tanh_approx) {
    float x2 = x * x;
    float u = kSqrt2OverPi * x * (1.0f + kCubic * x2);
    float e = expf(-2.0f * u);
    float s = 1.0f / (1.0f + e);  // (1 + tanh u) / 2
    if (dgelu != nullptr) {
      float s1s = 1.0f / (2.0f + e + 1.0f / e);  // s (1 - s) = (1 - tanh^2 u) / 4
      *dgelu = s + x * 2.0f * s1s * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x2);
    }
    return x * s;
  }
  float cdf = 0.5f * erfcf(-x * kInvSqrt2);
  if (dgelu != nullptr) *dgelu = cdf + x * kInvSqrt2Pi * expf(-0.5f * x * x);
  return x * cdf;
}

}  // namespace loom::kernels::cuda::pointwise
