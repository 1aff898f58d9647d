// Delayed scaling (Transformer Engine's DelayedScaling; Megatron's --fp8-recipe delayed):
// a tensor is quantised with a scale computed before it is seen, from the amaxes that its
// quantiser recorded over the last amax_history_len steps:
//   scale = fp8_max / amax / 2^margin,  amax = max of the history (or its newest entry),
// kept when that amax is 0 or not finite (a fresh quantiser's scale is 1). Every quantize
// records the tensor's amax in the history row of the current step (the max over its
// micro-batches); step_end reduces that row over the amax group, computes the scales of the
// next step (one fp8_scale_update for all quantisers) and starts a new row.
#pragma once

#include "plugins/fp8/scaling_recipe.h"

namespace loom::fp8 {

class DelayedScaling final : public ScalingRecipe {
 public:
  /// Options (manifest "delayed"): format, margin, amax_history_len (1024),
  /// amax_compute_algo ("max" or "most_recent").
  DelayedScaling(const nlohmann::json& options, IBuildContext& ctx);

  Status step_end(ICommunicator* amax_group, void* stream) noexcept override;

 private:
  void quantize_impl(int32_t id, const TensorView& x, const TensorView& y, const TensorView& yt,
                     const TensorView& scale_inv, void* stream) override;
  void allocate_state() override;

  int32_t history_len_;
  int32_t algo_;         ///< Fp8ScaleAttrs::algo: 0 max, 1 most recent
  int32_t current_ = 0;  ///< the history row of this step
  TensorView history_{}, scale_{}, scale_inv_{};  ///< (L, Q), (Q), (Q) on the device
};

}  // namespace loom::fp8
