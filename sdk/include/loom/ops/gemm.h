// Linear algebra: gemm. Part of the op catalogue: loom/ops.h states the conventions every op
// follows (layouts, dtypes, "+=" outputs, the random stream) and includes every family.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Linear algebra
// ---------------------------------------------------------------------------------------

/// "gemm": Y[b] = alpha * op(A[b]) @ op(B[b]) + beta * Y[b], for every batch index b.
///   inputs:  [0] A float (batch..., M, K), or (batch..., K, M) when trans_a
///            [1] B float (batch..., K, N), or (batch..., N, K) when trans_b; B may also
///                have no batch dimensions (2-D), and is then shared by every batch
///   outputs: [0] Y float (batch..., M, N); read only when beta != 0
/// Y's dtype may differ from A's and B's (weight gradients accumulate into f32).
/// f64: A, B and Y all f64 (the fp64 router's gating GEMMs), computed and accumulated in
/// f64; keyed on f64. No mix of f64 with another dtype (cast first).
inline constexpr const char* kGemm = "gemm";
struct GemmAttrs {
  int32_t trans_a;  ///< 1: A is stored transposed
  int32_t trans_b;  ///< 1: B is stored transposed (a Linear's weight (out, in) is)
  float alpha;
  float beta;  ///< 0 overwrites Y, 1 accumulates into it
};

/// "gemm_epilogue": a 2-D gemm with the elementwise work of a dense layer fused into it
/// (cuBLASLt's epilogues, Transformer Engine's gemm with bias, gelu and grad). With
///   Z (M, N) = op(A) @ op(B),   A (M, K), or (K, M) when trans_a; B (K, N), or (N, K) when trans_b
/// it computes, by attrs.epilogue:
///   kEpilogueBias       Y = Z + bias                     (bias broadcast over the rows)
///   kEpilogueGelu       P = Z + bias (P = Z without one); Y = gelu(P); aux = P when wanted
///                       (a linear layer and its activation: P is what the backward reads)
///   kEpilogueDGelu      Y = gelu'(P) * Z with P = input aux (the forward's pre-activation);
///                       dbias += the column sums of Y when wanted (the bias gradient of the
///                       layer whose pre-activation P is)
///   kEpilogueBiasGradA  Y = Z + beta * Y; dbias += the row sums of op(A) (a weight gradient
///                       dW = dY^T @ X with its bias gradient, the sum of dY over tokens)
///   inputs:  [0] A float (M, K) or (K, M), [1] B (K, N) or (N, K) in A's dtype,
///            [2] bias (N) in A's dtype: kEpilogueBias required, kEpilogueGelu optional,
///                otherwise empty
///            [3] P (M, N) in A's dtype: kEpilogueDGelu required, otherwise empty
///   outputs: [0] Y (M, N) in A's dtype; kEpilogueBiasGradA also f32 (weight gradients)
///            [1] aux P (M, N) in A's dtype: kEpilogueGelu optional, otherwise empty
///            [2] dbias f32 += : kEpilogueDGelu (N) or kEpilogueBiasGradA (M), optional;
///                otherwise empty
/// Rounding: a kernel rounds Y (and aux) to their dtype at least once and at most as often as
/// the unfused sequence (gemm, bias_add, gelu_fwd / gelu_bwd, bias_grad) would; dbias sums
/// may pass through Y's dtype once (cuBLASLt's bias gradient has Y's type). The tanh form
/// of GELU (approximate 1) may use a hardware tanh of relative error up to 2^-10 (cuBLASLt's
/// GELU epilogues do). So a fused kernel agrees with the unfused ops within the dtype's
/// tolerance of the result plus what these allow: one rounding of Z more or less (up to one
/// unit of |Z| in the last place, large against P where the bias cancels Z) and the tanh's
/// error. (The CUDA kernel takes cuBLASLt's GELU derivative for bf16 only: in f16 it missed
/// that bound.) Kernel "cpu.*", which runs exactly that sequence, agrees with them bit for
/// bit.
/// beta is 0 (overwrite Y) except with kEpilogueBiasGradA, where it may be 1 (accumulate).
inline constexpr const char* kGemmEpilogue = "gemm_epilogue";
inline constexpr int32_t kEpilogueBias = 1;
inline constexpr int32_t kEpilogueGelu = 2;
inline constexpr int32_t kEpilogueDGelu = 3;
inline constexpr int32_t kEpilogueBiasGradA = 4;
struct GemmEpilogueAttrs {
  int32_t trans_a;      ///< 1: A is stored transposed
  int32_t trans_b;      ///< 1: B is stored transposed (a Linear's weight (out, in) is)
  int32_t epilogue;     ///< kEpilogueBias, kEpilogueGelu, kEpilogueDGelu or kEpilogueBiasGradA
  int32_t approximate;  ///< gelu's variant (GeluAttrs): 0 erf, 1 tanh; read by the gelu epilogues
  float beta;           ///< 0, or 1 with kEpilogueBiasGradA
};

}  // namespace loom::ops
