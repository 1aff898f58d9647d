// Mamba-2: the causal depthwise convolution, the SSD (state-space duality) scan and the
// gated RMSNorm of the Mamba-2 mixer (Megatron-Core's MambaMixer, mamba_ssm's Mamba2). Part
// of the op catalogue: loom/ops.h states the conventions every op follows (layouts, dtypes,
// "+=" outputs, the random stream) and includes every family.
//
// B = batch, T = tokens, Cc = convolution channels, W = convolution width (d_conv),
// H = SSM heads, P = head dim (mamba_head_dim), G = groups of B and C (mamba_num_groups),
// N = state dim (mamba_state_dim), HG = H / G heads per group.
//
// The packed "xBC" layout (the convolution's channels, grouped as split_qkv's): each of the
// G groups holds its HG heads' x (HG * P channels, head-major), then its B (N), then its C (N):
//   xBC (B, T, G, HG * P + 2N), so Cc = G * (HG * P + 2N) = H * P + 2 * G * N.
// A tensor-parallel rank holding G / tp whole groups has a contiguous slice of that layout.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Mamba-2
// ---------------------------------------------------------------------------------------

/// "causal_conv1d": the depthwise causal convolution of every channel along T, then an
/// optional SiLU (mamba_ssm's causal_conv1d_fn; Megatron's conv1d with padding W - 1 cut to
/// the first T outputs):
///   u[b, t, c] = bias[c] + sum_{j=0}^{W-1} weight[c, j] * xe[b, t + j - (W - 1), c]
///   y = silu(u) when activation = 1, else u
/// where xe[b, s, c] = x[b, s, c] for s >= 0 and initial_state[b, W - 1 + s, c] for s < 0
/// (zeros without an initial state).
///   inputs:  [0] x float (B, T, Cc), [1] weight (Cc, W) x's dtype, [2] bias (Cc) x's dtype or
///            empty, [3] initial_state (B, W - 1, Cc) x's dtype or empty: the W - 1 inputs
///            before x[:, 0] (decoding: the previous call's final_state)
///   outputs: [0] y (B, T, Cc) x's dtype, [1] final_state (B, W - 1, Cc) x's dtype or empty:
///            the last W - 1 rows of the concatenation [initial_state (or zeros), x] along T
///            (equals initial_state shifted by T when T < W - 1); must not alias an input
/// "causal_conv1d_bwd": the gradient (no gradient of the initial state; it is for decoding).
///   inputs:  [0] dy (B, T, Cc), [1] x, [2] weight, [3] bias or empty, [4] initial_state or empty
///            (forward's inputs; SiLU's input is recomputed)
///   outputs: [0] dx (B, T, Cc) (overwritten), [1] dweight f32 (Cc, W) +=,
///            [2] dbias f32 (Cc) += or empty (empty exactly when bias is)
/// Both take CausalConv1dAttrs; W = weight.shape[1] in [1, 8].
inline constexpr const char* kCausalConv1d = "causal_conv1d";
inline constexpr const char* kCausalConv1dBwd = "causal_conv1d_bwd";
struct CausalConv1dAttrs {
  int32_t activation;  ///< 0 none, 1 SiLU
};

/// "ssd_scan": the selective state-space scan of Mamba-2 with the D skip connection. For each
/// batch row b and head h (group g = h / HG) a state S (P, N), f32, runs over t = 0 .. T-1:
///   dt   = dt_in[b, t, h] + dt_bias[h];  dt = softplus(dt) when dt_softplus (log1p(exp(dt)),
///          dt itself when dt > 20)
///   A    = -exp(A_log[h])
///   S    = exp(dt * A) * S + dt * outer(x[b, t, h, :], B[b, t, g, :])
///   y[b, t, h, :] = S @ C[b, t, g, :] + D[h] * x[b, t, h, :]
/// starting from S = initial_state[b, h] (zeros without one). x, B and C are read from the
/// packed xBC layout (above). The reference kernel runs this recurrence one step at a time; a
/// chunked kernel (SSD: quadratic within chunks of chunk_size steps, the state passed between
/// chunks) computes the same function, to rounding.
///   inputs:  [0] xBC float (B, T, G, HG * P + 2N), [1] dt_in (B, T, H) xBC's dtype,
///            [2] A_log (H) xBC's dtype, [3] D (H) xBC's dtype or empty (no skip),
///            [4] dt_bias (H) xBC's dtype or empty, [5] initial_state f32 (B, H, P, N) or empty
///   outputs: [0] y (B, T, H, P) xBC's dtype, [1] final_state f32 (B, H, P, N) or empty: S
///            after step T - 1 (decoding: the next call's initial_state; may alias input [5])
/// "ssd_scan_bwd": the gradient of y (the initial state gets none; it is for decoding).
///   inputs:  [0] dy (B, T, H, P), [1] xBC, [2] dt_in, [3] A_log, [4] D or empty,
///            [5] dt_bias or empty, [6] initial_state or empty (forward's inputs)
///   outputs: [0] dxBC (B, T, G, HG * P + 2N) xBC's dtype (overwritten: dx, dB, dC packed),
///            [1] ddt_in (B, T, H) xBC's dtype (overwritten), [2] dA_log f32 (H) +=,
///            [3] dD f32 (H) += or empty (empty exactly when D is),
///            [4] ddt_bias f32 (H) += or empty (empty exactly when dt_bias is)
/// Both take SsdScanAttrs; P, N and G are given there (the shapes fix H and HG * P + 2N only).
inline constexpr const char* kSsdScan = "ssd_scan";
inline constexpr const char* kSsdScanBwd = "ssd_scan_bwd";
struct SsdScanAttrs {
  int32_t head_dim;     ///< P >= 1
  int32_t state_dim;    ///< N >= 1
  int32_t num_groups;   ///< G >= 1, divides H
  int32_t chunk_size;   ///< steps per chunk of a chunked kernel; 0: the kernel's choice.
                        ///< Any value gives the same function (it is not Megatron's
                        ///< semantics-bearing option; it only tiles the work)
  int32_t dt_softplus;  ///< 1: dt = softplus(dt_in + dt_bias) (Mamba-2's default)
};

/// "rmsnorm_gated": Mamba-2's gated RMSNorm with the gate applied before the norm
/// (mamba_ssm's RMSNormGated with norm_before_gate = False, Megatron's MambaMixer.norm):
/// over each run of group_size channels of a row,
///   g = y * silu(z);  out = g * rstd * weight,  rstd = 1 / sqrt(mean(g^2 over the group) + eps)
///   inputs:  [0] y float (N, C), [1] z (N, C) y's dtype, [2] weight (C) y's dtype
///   outputs: [0] out (N, C) y's dtype, [1] rstd f32 (N, C / group_size)
/// "rmsnorm_gated_bwd":
///   inputs:  [0] dout (N, C), [1] y, [2] z, [3] weight, [4] rstd (forward's)
///   outputs: [0] dy (N, C), [1] dz (N, C) (both y's dtype, overwritten),
///            [2] dweight f32 (C) +=
/// Both take RmsNormGatedAttrs; group_size divides C.
inline constexpr const char* kRmsNormGated = "rmsnorm_gated";
inline constexpr const char* kRmsNormGatedBwd = "rmsnorm_gated_bwd";
struct RmsNormGatedAttrs {
  float eps;
  int32_t group_size;  ///< channels per norm group (C / G for the mixer's G groups)
};

}  // namespace loom::ops
