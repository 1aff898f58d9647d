// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"), as in
// torch.optim.AdamW and Megatron's Adam with decoupled weight decay.
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "plugins/optim/options.h"
#include "plugins/optim/step_kernels.h"

namespace loom::optim {

/// Options (manifest "adamw"): lr (1e-3), beta1 (0.9), beta2 (0.999), eps (1e-8),
/// weight_decay (0.01), exp_avg_dtype and exp_avg_sq_dtype ("f32", or "bf16": the moment is
/// stored in bf16 and computed in f32, Megatron-Core's precision-aware optimizer with
/// --exp-avg-dtype / --exp-avg-sq-dtype bf16), device and params_dtype (set by the core).
///
/// The core reads lr and weight_decay from the same spec node and hands them to every
/// update in OptimizerStep (lr from the schedule when there is one); update uses
/// hp->lr and hp->weight_decay, not the options, so that the schedule drives them. The
/// betas and eps are fixed at construction. The math is the "adamw_step" kernel's
/// (loom/ops.h), keyed on the gradient's dtype; update_many runs "adamw_step_multi", the
/// same math over many shards in one call, where the kernel library has it.
class AdamW final : public Object<IOptimizer> {
 public:
  AdamW(const nlohmann::json& options, IBuildContext& ctx);

  /// 2: "exp_avg" (first moment), "exp_avg_sq" (second moment).
  int32_t state_count() const noexcept override { return 2; }
  const char* state_name(int32_t index) const noexcept override;
  /// One step over a contiguous (n,) shard; decay == false (norms, biases) uses weight
  /// decay 0 whatever hp->weight_decay says. The cast of master into the parameter's own
  /// dtype is the core's (output [3] of adamw_step stays empty).
  Status update(const OptimizerStep* hp, bool decay, TensorView* master, const TensorView* grad,
                TensorView* states, void* stream) noexcept override;
  /// Every shard in one adamw_step_multi call per gradient dtype, the casts into the
  /// params fused (its output [4i + 3]). Where adamw_step_multi is served by another kernel
  /// than adamw_step (a spec pinning adamw_step, a library without the multi op), one
  /// adamw_step per shard instead, its output [3] the param: the same bits either way.
  Status update_many(const OptimizerStep* hp, int32_t count, const OptimizerShard* shards,
                     void* stream) noexcept override;
  /// The options' lr and weight_decay (optimizer 1.2).
  Status hyper(OptimizerHyper* out) const noexcept override { return fill_hyper(hyper_, out); }
  /// exp_avg_dtype, exp_avg_sq_dtype (optimizer 1.4).
  DType state_dtype(int32_t index) const noexcept override;

 private:
  /// adamw_step's attributes for one shard.
  ops::AdamWAttrs attrs(const OptimizerStep& hp, bool decay) const;

  float beta1_ = 0.9f;
  float beta2_ = 0.999f;
  float eps_ = 1e-8f;
  std::vector<DType> state_dtypes_{DType::kF32, DType::kF32};  ///< exp_avg, exp_avg_sq
  OptimizerHyper hyper_{};
  StepKernels kernels_;
  StepKernels multi_;  ///< adamw_step_multi; unresolved where no kernel serves it
};

}  // namespace loom::optim
