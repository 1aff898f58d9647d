// Delayed scaling (Transformer Engine's DelayedScaling; Megatron's --fp8-recipe delayed):
// a tensor is quantised with a scale computed before it is seen, from the amaxes that its
// quantiser recorded over the last amax_history_len steps:
//   scale = fp8_max / amax / 2^margin,  amax = max of the history (or its newest entry),
// kept when that amax is 0 or not finite (a fresh quantiser's scale is 1). Every quantize
// records the tensor's amax (the max over the step's micro-batches) in one fixed row, the
// same whatever the step, so that a captured graph of the forward and backward (which
// replays the addresses it saw) records into it on every replay, as Transformer Engine keeps
// its current amaxes at a fixed index for the same reason; step_end moves that row into
// the history row of the step, reduces it over the amax group, computes the scales of the
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
  /// 4: "amax_history" (L, Q), "scale" (Q), "scale_inv" (Q), and "history_position" (1):
  /// the history row of the coming step, as a float.
  int32_t state_count() const noexcept override { return 4; }
  Status state(int32_t index, Device device, const char** name, TensorView* view) noexcept override;
  /// amax_history along its columns (1), scale and scale_inv (0); history_position none.
  int32_t state_quantizer_dim(int32_t index) const noexcept override {
    return index == 0 ? 1 : index == 1 || index == 2 ? 0 : -1;
  }

 private:
  void quantize_impl(int32_t id, const TensorView& x, const TensorView& y, const TensorView& yt,
                     const TensorView& scale_inv, bool record, void* stream) override;
  /// The scale and the amax slot quantize_impl hands its kernel.
  void producer_impl(int32_t id, const TensorView& scale_inv, bool record, void* stream,
                     TensorView* scale, TensorView* amax) override;
  void allocate_state() override;

  int32_t history_len_;
  int32_t algo_ = 0;  ///< Fp8ScaleAttrs::algo: 0 max, 1 most recent
  /// Takes current_ from position_ when state() handed the tensors out (a restore may have
  /// written them); one read back after each such call.
  void sync_position();

  int32_t current_ = 0;                           ///< the history row of this step
  TensorView history_{}, scale_{}, scale_inv_{};  ///< (L, Q), (Q), (Q) on the device
  TensorView position_{};                         ///< (1): current_ as a float, on the device
  TensorView amax_now_{};  ///< (Q): this step's amaxes so far (zero between steps)
  bool reread_position_ = false;
};

}  // namespace loom::fp8
