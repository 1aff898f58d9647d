// Current (just-in-time) per-tensor scaling (Transformer Engine's Float8CurrentScaling;
// Megatron's --fp8-recipe tensorwise): each tensor's scale comes from its own amax,
// measured right before it is quantised: scale = fp8_max / amax / 2^margin (the previous
// scale kept for an all-zero or non-finite tensor). It costs one more read of the tensor
// than delayed scaling and keeps no history, so it needs nothing at the end of a step.
#pragma once

#include "plugins/fp8/scaling_recipe.h"

namespace loom::fp8 {

class TensorwiseScaling final : public ScalingRecipe {
 public:
  /// Options (manifest "tensorwise"): format, margin.
  TensorwiseScaling(const nlohmann::json& options, IBuildContext& ctx);

  /// Nothing to do: there is no history.
  Status step_end(ICommunicator* amax_group, void* stream) noexcept override;

 private:
  void quantize_impl(int32_t id, const TensorView& x, const TensorView& y, const TensorView& yt,
                     const TensorView& scale_inv, bool record, void* stream) override;
  void allocate_state() override;

  TensorView amax_{}, scale_{}, scale_inv_{};  ///< (Q) each, on the device
};

}  // namespace loom::fp8
