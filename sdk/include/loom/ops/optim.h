// Optimizer steps on contiguous shards of f32 master weights (AdamW, multi-tensor AdamW, SGD). Part
// of the op catalogue: loom/ops.h states the conventions every op follows (layouts, dtypes, "+="
// outputs, the random stream) and includes every family.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Optimizer steps (on contiguous f32 shards)
// ---------------------------------------------------------------------------------------

// Step scalars (ABI 1.11): the optimizer ops below take an optional last input, the
// step's scalars in device memory, f64 (kStepScalarCount) on the op's device:
//   [kStepLr] learning rate, [kStepIndex] the 1-based step, [kStepGradScale] the gradient
//   scale, [kStepSkip] nonzero: the call writes nothing (a non-finite gradient norm or
//   loss); and for grad_norm_clip: [kStepNormDivisor] the loss scale the gradients carry
//   (1 without one), [kStepGradNorm] the gradient norm it writes.
// With them a call reads lr, step and grad_scale there, when it runs, in place of its attrs'
// (which must still be valid): a captured graph of the optimizer's step (/train/cuda_graph
// "step") replays the same launches with each step's values. The kernel converts them as
// a caller converts the host's doubles into the attrs (lr and grad_scale rounded to f32,
// the step truncated), so a call gives the same bits either way. A kernel library built
// against older headers refuses the extra input (its input count): rebuild it.
inline constexpr int kStepScalarCount = 6;
enum StepScalar : int {
  kStepLr = 0,
  kStepIndex = 1,
  kStepGradScale = 2,
  kStepSkip = 3,
  kStepNormDivisor = 4,
  kStepGradNorm = 5,
};

/// "grad_norm_clip": the gradient norm and clipping of a step on the device, in f64:
/// norm = sqrt(sumsq[0]) / S[kStepNormDivisor]; S[kStepGradNorm] = norm; S[kStepSkip] = 1
/// when it was nonzero or norm is not finite; else, when max_norm > 0 and
/// c = max_norm / (norm + 1e-6) < 1, S[kStepGradScale] *= c (Megatron's clip_grad_norm).
///   inputs:  [0] sumsq f64 (1): the gradients' sum of squares (sumsq_multi)
///   outputs: [0] S f64 (kStepScalarCount): the step scalars, read and written
///   attrs:   GradNormClipAttrs (required)
inline constexpr const char* kGradNormClip = "grad_norm_clip";
struct GradNormClipAttrs {
  double max_norm;  ///< clip to this global norm; 0: no clipping
};

/// "adamw_step": g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// w -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w).
///   inputs:  [0] grad float (n); [1] optional: step scalars (above)
///   outputs: [0] master f32 (n), [1] exp_avg f32 or bf16 (n), [2] exp_avg_sq f32 or bf16
///            (n), all read and written; [3] param float (n) or empty: receives the new
///            master, cast
/// Keyed on the dtype of grad.
/// A bf16 moment (ABI 1.15; each of the two on its own) is stored in bf16 and computed in f32:
/// the kernel widens it, updates it with the f32 arithmetic of an f32 moment, and stores it
/// rounded to nearest even. So a call with bf16 moments gives, bit for bit, what the same
/// kernel gives with f32 moments holding the same values, followed by a cast of the new
/// moments to bf16 (master and param alike). These are Megatron-Core's precision-aware
/// optimizer's states (--exp-avg-dtype / --exp-avg-sq-dtype bf16, Transformer Engine's
/// FusedAdam): 4 bytes an element less to read and 4 to write for both. A kernel library
/// built with older headers refuses bf16 moments ("expected f32"): rebuild it.
inline constexpr const char* kAdamWStep = "adamw_step";
struct AdamWAttrs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;  ///< 0 for parameters without decay
  float grad_scale;
  int64_t step;  ///< 1-based, for bias correction
};

/// "adamw_step_multi": adamw_step over K shards in one call, the multi-tensor optimizer step
/// (apex / PyTorch's foreach AdamW): a GPU library launches one kernel per table of shards
/// instead of two (update and cast) per parameter tensor. Shard i is exactly adamw_step
/// with weight decay weight_decay[i]: its results are bit-identical to K adamw_step calls
/// of the same kernel library.
///   inputs:  [i] grad_i float (n_i), i in [0, K); every grad of one dtype (the op is keyed
///            on it: shards with f32 and bf16 gradients take one call per dtype); [K]
///            optional: step scalars (above), for every shard
///   outputs: 4K views, for shard i: [4i] master_i f32 (n_i), [4i+1] exp_avg_i f32 or bf16
///            (n_i), [4i+2] exp_avg_sq_i f32 or bf16 (n_i), all read and written (a bf16
///            moment as adamw_step's); [4i+3] param_i float (n_i) or empty: receives the new
///            master, cast (adamw_step's output [3])
///   attrs:   AdamWMultiAttrs (required)
/// K >= 1; n_i may be 0. Shards must not overlap one another (they run in any order, in
/// parallel); params may differ in dtype, and so may the moments.
inline constexpr const char* kAdamWStepMulti = "adamw_step_multi";
struct AdamWMultiAttrs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float grad_scale;
  int32_t count;  ///< K, the number of shards: the call's num_inputs (K + 1 with scalars)
  int64_t step;   ///< 1-based, for bias correction
  /// [count] floats in host memory (whatever device the tensors are on): shard i's weight
  /// decay, 0 for parameters without decay. Read during the call only.
  const float* weight_decay;
};

/// "sgd_step": g = grad * grad_scale + weight_decay * w; buf = momentum * buf + g (buf = g
/// at step 1); w -= lr * (nesterov ? g + momentum * buf : buf).
///   inputs:  [0] grad float (n); [1] optional: step scalars (above; step 1 starts buf)
///   outputs: [0] master f32 (n), [1] momentum buffer f32 (n) (empty when momentum == 0),
///            [2] param float (n) or empty
inline constexpr const char* kSgdStep = "sgd_step";
struct SgdAttrs {
  float lr;
  float momentum;
  float weight_decay;
  float grad_scale;
  int32_t nesterov;
  int64_t step;
};

}  // namespace loom::ops
