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

}  // namespace loom::ops
