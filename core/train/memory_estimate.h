// The analytic memory estimate of a training run, to set beside the measured peak: weights,
// f32 gradients, f32 master weights, optimizer states, the distributed optimizer's gradient
// shard and all-gather buffer, the FP8 recipe's state (all as allocated) and the activations
// at the peak of one micro-batch, which the model says (IModel::cost, model 1.1; the
// transformer plugin's formula is plugins/transformer/gpt_cost.cc). The core knows no
// model's options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom::core {

/// Bytes by category. activations is empty when the model does not say.
struct MemoryEstimate {
  uint64_t weights = 0;
  uint64_t grads = 0;
  uint64_t master = 0;
  uint64_t optimizer = 0;
  uint64_t fp8 = 0;  ///< the FP8 recipe's state (amax histories, scales)
  /// The distributed optimizer's buffers: this rank's f32 gradient shard and the
  /// parameters' all-gather input (the largest bucket chunk); 0 without it.
  uint64_t shard_buffers = 0;
  std::optional<uint64_t> activations;
  /// The activations include a mixture of experts' layers, whose rows per expert the model
  /// sizes for balanced routing (or at the capacity's bound): a run routed unevenly may
  /// hold more.
  bool routed = false;

  /// The sum (activations counted as 0 when unknown).
  uint64_t total() const;
  /// "2.31 GiB: weights 0.46, grads 0.46, master 0, optimizer 0.93, activations 0.46 GiB"
  /// (", zero-1 buffers 0.23" and ", fp8 state 0.01" before the activations when there are
  /// some; " (MoE rows as if balanced, or at capacity)" after them when routed).
  std::string describe() const;
};

}  // namespace loom::core
