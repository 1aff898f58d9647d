// Elementwise ops: add, bias, cast, scale, reductions (sumsq, amax), activations (GELU, SwiGLU) and
// dropout. Part of the op catalogue: loom/ops.h states the conventions every op follows (layouts,
// dtypes, "+=" outputs, the random stream) and includes every family.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------

/// "add": Y = A + B (same shape, any float dtypes; or A, B and Y all f64, added in f64).
/// Y may alias A or B.
///   inputs: [0] A, [1] B   outputs: [0] Y
inline constexpr const char* kAdd = "add";

/// "bias_add": Y[n, c] += bias[c] in place.
///   inputs: [0] bias float (C)   outputs: [0] Y float (N, C), read and written
/// Keyed on the dtype of Y.
inline constexpr const char* kBiasAdd = "bias_add";

/// "bias_grad": dbias[c] += sum_n dY[n, c].
///   inputs: [0] dY float (N, C)   outputs: [0] dbias f32 (C) +=
inline constexpr const char* kBiasGrad = "bias_grad";

/// "cast": Y = X converted to Y's dtype (float dtypes, round to nearest even). X and Y may
/// also be f64 (either or both): to f64 exactly; from f64 to f32 round to nearest even, to
/// bf16 / f16 through f32 (two roundings, as PyTorch's double -> bfloat16 / half).
/// The kernel of any dtype key serves every pair (keyed on f64 too).
///   inputs: [0] X   outputs: [0] Y (same shape)
inline constexpr const char* kCast = "cast";

/// "scale": Y = alpha * X (Y may alias X).
///   inputs: [0] X float   outputs: [0] Y float
inline constexpr const char* kScale = "scale";
struct ScaleAttrs {
  float alpha;
};

/// "sumsq": out[0] += sum of X^2 in f64 (non-finite inputs give a non-finite result).
///   inputs: [0] X float (any shape)   outputs: [0] out f64 (1) +=
inline constexpr const char* kSumSq = "sumsq";

/// "sumsq_multi": sumsq over K tensors in one call (the gradient norm's sum of squares,
/// apex's multi_tensor_l2norm): out[0] += sum_i sum of X_i^2 in f64. A GPU library
/// launches once per table of tensors instead of once per tensor; the CPU kernels run
/// sumsq on each X_i in order, so their result equals K sumsq calls bit for bit.
///   inputs:  [i] X_i float (any shape, may be empty), i in [0, K), every X_i of one dtype
///            (the op is keyed on it)
///   outputs: [0] out f64 (1) +=
///   attrs:   SumSqMultiAttrs (required)
inline constexpr const char* kSumSqMulti = "sumsq_multi";
struct SumSqMultiAttrs {
  int32_t count;  ///< K >= 1: must equal the call's num_inputs
};

/// "amax": out[0] = max(out[0], max |X|) in f32, for FP8 scaling recipes (amax history)
/// and overflow checks. NaN propagates: a NaN in X or in out[0] gives NaN. Start from
/// out[0] = 0 for the amax of X alone; an empty X leaves out[0] unchanged.
///   inputs: [0] X float (any shape)   outputs: [0] out f32 (1), read and written
inline constexpr const char* kAmax = "amax";

/// "gelu_fwd" / "gelu_bwd": Y = gelu(X), exact (erf) or tanh approximation.
///   fwd inputs: [0] X float (N)            outputs: [0] Y float (N)
///   bwd inputs: [0] dY (N), [1] X (N)      outputs: [0] dX (N)
inline constexpr const char* kGeluFwd = "gelu_fwd";
inline constexpr const char* kGeluBwd = "gelu_bwd";
struct GeluAttrs {
  int32_t approximate;  ///< 0: x * Phi(x) (erf); 1: tanh approximation (GPT-2)
};

/// "swiglu_fwd" / "swiglu_bwd": Y = silu(X[:, :F]) * X[:, F:] (Megatron's fused layout:
/// the gate is the first half of the fc1 output, the up projection the second).
///   fwd inputs: [0] X float (N, 2F)                outputs: [0] Y float (N, F)
///   bwd inputs: [0] dY (N, F), [1] X (N, 2F)       outputs: [0] dX (N, 2F)
inline constexpr const char* kSwigluFwd = "swiglu_fwd";
inline constexpr const char* kSwigluBwd = "swiglu_bwd";

/// "dropout_fwd" / "dropout_bwd": Y = X * keep / (1 - p), the mask drawn from (key,
/// counter) as described above, so backward redraws it instead of storing it.
///   fwd inputs: [0] X float   outputs: [0] Y float   (Y may alias X)
///   bwd inputs: [0] dY        outputs: [0] dX
inline constexpr const char* kDropoutFwd = "dropout_fwd";
inline constexpr const char* kDropoutBwd = "dropout_bwd";
struct DropoutAttrs {
  float p;  ///< drop probability in [0, 1)
  uint64_t key;
  uint64_t counter;
};

}  // namespace loom::ops
