// GraphedUpdate: the optimizer's part of a step under /train/cuda_graph "step" (Megatron's
// --optimizer-cuda-graph, beside GraphedPass's forward and backward): the gradient norm's
// sum of squares, the norm and the clipping factor ("grad_norm_clip") and the update of
// every shard, captured once as a device graph (IDeviceRuntime 1.1) and replayed every
// later step, where a direct step issues them one by one and reads the norm back between.
//
// What changes from step to step lives in the step scalars (loom/ops/optim.h), a static
// device block the host fills before each replay: the learning rate, the step, the
// gradient scale before clipping (cp / loss scale), the loss scale the norm divides by, and
// the skip flag (a non-finite loss). Inside the graph, grad_norm_clip writes the norm, the
// clipped gradient scale and the skip flag for a non-finite norm there, and the optimizer's
// kernels read them when they run (optimizer 1.3, OptimizerStep::scalars). The same
// expressions as a direct step (loom/cpp/step_scalars.h, loom/cpp/adamw_coef.h), so a
// replay updates the parameters as a direct step would, to the bit. The norm and the skip
// flag are read back after the replay, for the log and the loss scaler.
//
// The trainer uses it only where it uses GraphedPass (one process, one chunk), without
// result validation (which must see the norm before the update) and without experts'
// parameters (their norm is summed apart), after the same warm-up.
#pragma once

#include <cstdint>

#include "core/optim/distributed_optimizer.h"
#include "core/plugin/host.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds/optimizer.h"

namespace loom::core {

class GraphedUpdate {
 public:
  /// \param host       the core's host: its runtime for `device` must be device_runtime 1.1
  /// \param device     where the optimizer's tensors live (not the CPU)
  /// \param optim      the step's optimizer side (outlives this object)
  /// \param optimizer  the optimizer plugin's component: optimizer 1.3 or later
  /// \param max_norm   /train/grad_clip (0: no clipping)
  /// Throws InvalidArgument naming /train/cuda_graph when the device cannot capture graphs,
  /// the optimizer predates step scalars, or no kernel serves grad_norm_clip.
  GraphedUpdate(Host& host, Device device, DistributedOptimizer& optim, const IOptimizer& optimizer,
                double max_norm);
  ~GraphedUpdate();
  GraphedUpdate(const GraphedUpdate&) = delete;
  GraphedUpdate& operator=(const GraphedUpdate&) = delete;

  /// What a replay computed.
  struct Result {
    double grad_norm;  ///< the global gradient norm, unscaled
    bool skipped;      ///< no update: the loss or the norm was not finite
  };
  /// Runs the optimizer's part of the step (captured at the first call, replayed from then
  /// on) and waits for it.
  /// \param hp            the step: step, lr and weight decay as a direct step passes them,
  ///                      grad_scale before clipping (cp / loss scale)
  /// \param norm_divisor  the loss scale the gradients carry, over cp (grad_norm's)
  /// \param loss_finite   false: skip the update (as a direct step does)
  /// Throws, naming /train/cuda_graph, when the capture fails or the weight decay changed
  /// since it (the kernels' attrs hold it).
  Result run(const OptimizerStep& hp, double norm_divisor, bool loss_finite);

  /// Replays so far (for the log and tests).
  int64_t replays() const { return replays_; }

 private:
  void capture(const OptimizerStep& hp);

  Host& host_;
  Device device_;
  DistributedOptimizer& optim_;
  IDeviceRuntime& runtime_;
  Kernel clip_;  // grad_norm_clip
  double max_norm_;
  void* block_ = nullptr;  // f64: the step scalars (ops::kStepScalarCount), then the sum of squares
  void* graph_ = nullptr;
  double captured_weight_decay_ = 0;
  int64_t replays_ = 0;
};

}  // namespace loom::core
