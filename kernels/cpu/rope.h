// rope's per-position formulas, shared by rope_fwd / rope_bwd (rope.cc) and the fused
// rope_fp8_bwd (rope_fp8.cc), so that the fused op computes what the unfused one stores, bit for
// bit, before it quantises it. sign = +1 turns by +angle (forward), -1 by -angle (backward);
// channel i < half pairs with i + half.
#pragma once

#include <stdint.h>

namespace loom::kernels::cpu {

/// The reference's pair (x1, x2) = (channel i, channel i + half) turned by sign * angle,
/// angle = pos * inv_freq in f64: *y1 = x1 c - x2 s, *y2 = x2 c + x1 s, in f64, each rounded
/// to f32 once.
void rope_ref_pair(double pos, float inv_freq, double sign, double x1, double x2, float* y1,
                   float* y2);

/// The fast kernels' cosines and sines of one position: cs[i] = cos(pos inv_freq[i]), sn[i] =
/// sign sin(pos inv_freq[i]), each formed in f64 and rounded to f32, i < half.
void rope_cos_sin_fast(double pos, const float* inv_freq, int64_t half, double sign, float* cs,
                       float* sn);
/// The fast kernels' rotation of one head's channels in f32 (AVX2 + FMA: call it only where
/// cpu_has_avx2()): x[i], x[i + half] <- x[i] cs[i] - x[i + half] sn[i],
/// x[i + half] cs[i] + x[i] sn[i], i < half.
void rope_rotate_fast(float* x, const float* cs, const float* sn, int64_t half);

}  // namespace loom::kernels::cpu
