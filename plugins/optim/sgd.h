// Stochastic gradient descent with momentum and Nesterov momentum, as torch.optim.SGD
// (dampening 0): weight decay is an L2 term added to the gradient, not decoupled.
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "plugins/optim/options.h"
#include "plugins/optim/step_kernels.h"

namespace loom::optim {

/// Options (manifest "sgd"): lr (1e-3), momentum (0.9), nesterov (false), weight_decay (0),
/// device and params_dtype (set by the core).
///
/// As for AdamW, update uses hp->lr and hp->weight_decay (the core fills them from the
/// schedule and from this node's options); momentum and nesterov are fixed at
/// construction. The math is the "sgd_step" kernel's (loom/ops.h).
class Sgd final : public Object<IOptimizer> {
 public:
  Sgd(const nlohmann::json& options, IBuildContext& ctx);

  /// 1 ("momentum_buffer") when momentum > 0, else 0.
  int32_t state_count() const noexcept override { return momentum_ > 0 ? 1 : 0; }
  const char* state_name(int32_t index) const noexcept override;
  /// One step over a contiguous (n,) shard; decay == false uses weight decay 0. At
  /// hp->step == 1 the momentum buffer is set to the gradient (its old contents are
  /// ignored), as PyTorch does on its first step.
  Status update(const OptimizerStep* hp, bool decay, TensorView* master, const TensorView* grad,
                TensorView* states, void* stream) noexcept override;
  /// One sgd_step per shard (there is no multi-tensor SGD op), the cast into the param
  /// fused into it (its output [2]).
  Status update_many(const OptimizerStep* hp, int32_t count, const OptimizerShard* shards,
                     void* stream) noexcept override;
  /// The options' lr and weight_decay (optimizer 1.2).
  Status hyper(OptimizerHyper* out) const noexcept override { return fill_hyper(hyper_, out); }
  /// The momentum buffer is f32 (optimizer 1.4).
  DType state_dtype(int32_t index) const noexcept override {
    return index >= 0 && index < state_count() ? state_dtypes_[static_cast<size_t>(index)]
                                               : DType::kInvalid;
  }

 private:
  /// sgd_step's attributes for one shard.
  ops::SgdAttrs attrs(const OptimizerStep& hp, bool decay) const;

  float momentum_ = 0.9f;
  bool nesterov_ = false;
  std::vector<DType> state_dtypes_;  ///< f32 for the momentum buffer, when there is one
  OptimizerHyper hyper_{};
  StepKernels kernels_;
};

}  // namespace loom::optim
