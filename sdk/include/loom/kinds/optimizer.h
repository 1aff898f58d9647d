// kinds::kOptimizer and kinds::kLrSchedule.
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
};

/// An optimizer updates fp32 master weights from gradients. The core owns every buffer;
/// the optimizer says how many state tensors it wants per parameter and their dtype, and
/// the core allocates them (sharded across DP ranks for the distributed optimizer).
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
  /// \param states     [state_count()] (n,) f32 state tensors, updated in place
  /// \param stream     device stream or null
  virtual Status update(const OptimizerStep* hp, bool decay, TensorView* master,
                        const TensorView* grad, TensorView* states, void* stream) noexcept = 0;

 protected:
  ~IOptimizer() = default;
};

/// A learning-rate schedule: a pure function of the step (resume needs no other state).
class ILrSchedule : public IObject {
 public:
  /// Learning rate at 1-based optimizer `step`.
  virtual double lr(int64_t step) const noexcept = 0;

 protected:
  ~ILrSchedule() = default;
};

}  // namespace loom
