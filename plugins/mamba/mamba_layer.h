// MambaLayer (kinds::kLayer "mamba_layer"): the Mamba layer of Megatron-Core's hybrid models
// (MambaLayer, the "M" of a hybrid_layer_pattern), pre-norm with a residual:
//   y = x + dropout(mixer(norm(x)))
// Children (spec slots): "norm" (norm.weight (C)) and "mixer" (e.g. mamba2: mixer.*). A norm
// of 1.2 (loom/kinds/model.h) adds the residual's gradient into its input gradient.
//   forward:  [0] hidden (B, T, C) (the sequence shard with sequence parallelism),
//             [1] position ids (B, T) or empty (unused: a Mamba layer has no positions),
//             [2] segment ids or empty: refused (the SSM state would run across documents)
//             -> [0] (B, T, C)
//   backward: dy -> dx (and empty gradients for the ids)
// Recompute kFull: only the input is saved; backward reruns forward, then goes back.
// Context parallelism is refused (each rank would need the state of the chunks before it).
// Decoding: the mixer keeps its state in the context's kv cache (mamba_mixer.h).
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/mamba/toolkit.h"

namespace loom::mamba {

class MambaLayer final : public ModuleBase<ILayer> {
 public:
  MambaLayer(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  TensorView forward_impl(IForwardContext& ctx, const TensorView& x);

  int64_t hidden_;
  float hidden_dropout_;
  TensorParallel tp_;
  int32_t cp_rank_ = 0, cp_size_ = 1;
  DType dtype_;
  Device device_;
  IModule *norm_ = nullptr, *mixer_ = nullptr;
  Kernel add_, dropout_fwd_, dropout_bwd_;
};

}  // namespace loom::mamba
