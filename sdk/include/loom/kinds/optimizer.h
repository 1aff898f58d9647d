// kinds::kOptimizer and kinds::kLrSchedule.
//
// Optimizer 1.1 (ABI 1.3) appends IOptimizer::update_many, the whole step in one call (on a
// GPU: one multi-tensor kernel launch per table of shards instead of an update and a cast
// launch per parameter). A caller checks `has_update_many` (below) before calling it: an
// optimizer built against older headers has no such method. Optimizer 1.2 (ABI 1.5) appends
// IOptimizer::hyper. Optimizer 1.3 (ABI 1.11) appends OptimizerStep::scalars: the step's
// learning rate, step, gradient scale and skip flag in device memory, read by the kernels
// when they run, so that the update can be captured once in a graph and replayed every step
// (/train/cuda_graph "step"); a caller checks `has_step_scalars` before passing them.
// Optimizer 1.4 (ABI 1.15) appends IOptimizer::state_dtype: the dtype the core allocates each
// state tensor in (f32, or bf16 for AdamW's moments kept as Megatron's precision-aware
// optimizer keeps them); the core checks `has_state_dtype` and allocates f32 states for an
// older optimizer.
//
// What loom hands an optimizer and what it reads back (the whole contract; nothing else is
// read by name):
//  - Inherited options (IBuildContext::inherited, loom/cpp/nn/options.h): "device" ("cpu",
//    "cuda") and "params_dtype" ("f32", "bf16", "f16"), the parameters' dtype; declare them
//    in the manifest's option schema if you read them as options.
//  - The learning rate and weight decay: from hyper() (optimizer 1.2), whatever the options
//    are called. For an optimizer 1.0 or 1.1 loom reads the options "lr" and
//    "weight_decay" by those names (absent: 0), so such a plugin must use them.
//  - An LR schedule gets inherited "train_steps" (/train/steps) and "lr" (the optimizer's
//    learning rate, its peak).
//  - Each step: update_many when the optimizer has it (1.1+), else update per shard and
//    then loom's own cast of each master into a bf16/f16 parameter. So a 1.1+ optimizer's
//    update() is not called by the trainer (keep it correct: tools and tests may call it),
//    and its update_many must write the cast into OptimizerShard::param when that view is
//    present; loom reads the first such shard back after the first step and stops the run,
//    naming the parameter, if the cast is missing.
#pragma once

#include <stdint.h>

#include "loom/object.h"
#include "loom/status.h"
#include "loom/types.h"

namespace loom {

/// Hyper-parameters that may change every step (from the LR schedule and the trainer).
struct OptimizerStep {
  uint32_t struct_size;
  int64_t step;         ///< 1-based optimizer step
  double lr;            ///< learning rate for this step
  double weight_decay;  ///< decoupled weight decay for params without kParamNoWeightDecay
  double grad_scale;    ///< gradients are multiplied by this first (clipping, 1/loss scale)
  /// Optimizer 1.3: the step scalars (loom/ops/optim.h, f64 (ops::kStepScalarCount)) on the
  /// optimizer's device, or empty (data null). When present, the update's kernels read the
  /// learning rate, the step and the gradient scale there, and write nothing when its skip
  /// flag is set; the fields above must still hold valid values (weight_decay is read from
  /// them either way). Pass them to the step ops as their last input (ops::kAdamWStep ...).
  /// Read it only when struct_size covers it (a caller built against older headers).
  TensorView scalars;
};

/// What an optimizer was configured with (IOptimizer::hyper, optimizer 1.2).
struct OptimizerHyper {
  uint32_t struct_size;  ///< sizeof(OptimizerHyper) of the caller
  /// The learning rate: the constant rate without an LR schedule, the peak rate a schedule
  /// starts from (handed to it as its inherited "lr").
  double lr;
  double weight_decay;  ///< decoupled weight decay (OptimizerStep::weight_decay); 0 for none
};

/// One shard of IOptimizer::update_many: what IOptimizer::update takes for one shard, and
/// the parameter to receive the new master weights. A plain value struct; the tensors are
/// the caller's.
struct OptimizerShard {
  /// sizeof(OptimizerShard) of the caller. Also the stride of the caller's array: a newer
  /// caller's shards may be larger (fields are appended), so an optimizer steps through
  /// the array by shards[0].struct_size, not by its own sizeof.
  uint32_t struct_size;
  int32_t decay;      ///< 1: weight decay (OptimizerStep::weight_decay) applies; 0: none
  TensorView master;  ///< (n,) f32 master weights, updated in place
  TensorView grad;    ///< (n,) gradient, f32 or the parameter dtype
  /// [state_count()] (n,) state tensors, each of IOptimizer::state_dtype (f32 for an optimizer
  /// older than 1.4), updated in place
  TensorView* states;
  /// (n,) the parameter in its own dtype, overwritten with the new master weights cast to
  /// it (round to nearest even, as the "cast" op), or empty (data null): no cast (an f32
  /// parameter is its own master, or the caller casts).
  TensorView param;
};

/// An optimizer updates fp32 master weights from gradients. The core owns every buffer;
/// the optimizer says how many state tensors it wants per parameter and their dtype
/// (state_dtype, optimizer 1.4), and the core allocates them (sharded across DP ranks for
/// the distributed optimizer).
class IOptimizer : public IObject {
 public:
  /// Number of state tensors per parameter (AdamW: 2, SGD with momentum: 1).
  virtual int32_t state_count() const noexcept = 0;
  /// Name of state `index` for checkpoints ("exp_avg"), static string.
  virtual const char* state_name(int32_t index) const noexcept = 0;
  /// Updates one contiguous shard of one parameter in place.
  /// \param hp         the step's hyper-parameters
  /// \param decay      whether weight decay applies to this parameter
  /// \param master     (n,) f32 master weights, updated in place
  /// \param grad       (n,) gradient, f32 or the parameter dtype
  /// \param states     [state_count()] (n,) state tensors of state_dtype (f32 before 1.4),
  ///                   updated in place
  /// \param stream     device stream or null
  virtual Status update(const OptimizerStep* hp, bool decay, TensorView* master,
                        const TensorView* grad, TensorView* states, void* stream) noexcept = 0;
  /// Updates `count` shards, with the results of update() on each shard followed by a cast
  /// of its master into its param when the param is present, bit for bit; an optimizer
  /// may do it in fewer kernel launches. The shards must not overlap. The tensors of every
  /// shard are checked before any is updated; an error of a kernel after that may leave
  /// some shards updated. Optimizer 1.1 (ABI 1.3): check has_update_many() first.
  /// \param hp      the step's hyper-parameters (weight_decay for shards with decay = 1)
  /// \param count   number of shards, >= 0 (0 does nothing)
  /// \param shards  [count] shards, each shards[0].struct_size bytes apart
  /// \param stream  device stream or null
  virtual Status update_many(const OptimizerStep* hp, int32_t count, const OptimizerShard* shards,
                             void* stream) noexcept = 0;
  /// The learning rate and weight decay this optimizer was configured with (from its own
  /// options, whatever their names). Optimizer 1.2 (ABI 1.5): check has_hyper() first.
  /// \param[out] out  filled up to out->struct_size
  virtual Status hyper(OptimizerHyper* out) const noexcept = 0;
  /// The dtype of state `index` in [0, state_count()): kF32, or kBF16 for a state the
  /// optimizer's kernels keep in bf16 and compute in f32. The core allocates the state
  /// (zeroed) in it, counts its bytes in the memory estimate, and saves it in it in
  /// checkpoints; a checkpoint with the state in another float dtype converts on loading
  /// (bf16 to f32 exactly, f32 to bf16 rounded to nearest even). kInvalid for an index out
  /// of range. Optimizer 1.4 (ABI 1.15): check has_state_dtype() first.
  virtual DType state_dtype(int32_t index) const noexcept = 0;

 protected:
  ~IOptimizer() = default;
};

/// Whether `optimizer` implements optimizer 1.1, i.e. has update_many. Call it only when this
/// is true: an object built against older headers has no such entry.
inline bool has_update_many(const IOptimizer& optimizer) noexcept {
  InterfaceInfo info = optimizer.interface_info();
  return info.major == 1 && info.minor >= 1;
}

/// Whether `optimizer` implements optimizer 1.2, i.e. has hyper.
inline bool has_hyper(const IOptimizer& optimizer) noexcept {
  InterfaceInfo info = optimizer.interface_info();
  return info.major == 1 && info.minor >= 2;
}

/// Whether `optimizer` implements optimizer 1.3, i.e. honours OptimizerStep::scalars.
inline bool has_step_scalars(const IOptimizer& optimizer) noexcept {
  InterfaceInfo info = optimizer.interface_info();
  return info.major == 1 && info.minor >= 3;
}

/// Whether `optimizer` implements optimizer 1.4, i.e. has state_dtype. An older optimizer's
/// states are f32.
inline bool has_state_dtype(const IOptimizer& optimizer) noexcept {
  InterfaceInfo info = optimizer.interface_info();
  return info.major == 1 && info.minor >= 4;
}

/// A learning-rate schedule: a pure function of the step (resume needs no other state).
class ILrSchedule : public IObject {
 public:
  /// Learning rate at 1-based optimizer `step`.
  virtual double lr(int64_t step) const noexcept = 0;

 protected:
  ~ILrSchedule() = default;
};

}  // namespace loom
