// swiglu's element formulas, shared by swiglu_fwd / swiglu_bwd (activations.cc) and the
// fused swiglu_fp8_fwd / swiglu_fp8_bwd (swiglu_fp8.cc), so that a fused op computes what the
// unfused one stores, bit for bit, before it quantises it.
#pragma once

#include <stdint.h>

namespace loom::kernels::cpu {

/// The reference's y = silu(g) * u of one element: in f64, rounded to f32 once.
float swiglu_fwd_ref_value(double g, double u);
/// The reference's gradients of one element: dg = dy * u * s * (1 + g (1 - s)),
/// du = dy * g * s, s = sigmoid(g), in f64, each rounded to f32 once.
void swiglu_bwd_ref_values(double g, double u, double dy, float* dg, float* du);

/// The fast kernels' rows (AVX2 + FMA: call them only where cpu_has_avx2()), over `padded`
/// elements, a multiple of 8 (pad with zeros; their results are 0 and unused).
///   forward:  g[j] = silu(g[j]) * u[j]
///   backward: g[j] = dg, u[j] = du of (g[j], u[j], dy[j])
void swiglu_fwd_row_fast(float* g, const float* u, int64_t padded);
void swiglu_bwd_row_fast(float* g, float* u, const float* dy, int64_t padded);

}  // namespace loom::kernels::cpu
