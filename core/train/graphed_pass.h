// GraphedPass: /train/cuda_graph "forward_backward" (Megatron's --enable-cuda-graph). A
// micro-batch's forward and backward are captured once as a device graph (IDeviceRuntime
// 1.1, loom/device.h) and then replayed for every micro-batch of every later step, so the
// host issues one launch where it issued hundreds of kernels.
//
// What a replay repeats is exactly what the capture saw, so the pass runs on fixed
// addresses and reads nothing from the host:
//   - the micro-batch's tokens, labels, loss mask, positions and segment ids are copied into
//     static device buffers before each replay (the capture read those buffers);
//   - the loss gradient (the step's loss_weight: loss scale / micro-batches, which a dynamic
//     loss scale changes) is copied into a static scalar the same way;
//   - the mean loss is copied, inside the graph, into a static scalar read after the replay;
//   - the gradients accumulate into the parameter set's flat gradients, which the trainer
//     zeroes before each step, as a direct step does; with one micro-batch a step a weight
//     gradient's first write overwrites instead (grad_first_write, as in a direct step: the
//     graph holds the capture's answers, and those gradients get no zero fill), with several
//     every write adds (one graph serves every micro-batch);
//   - activations come from the graph's private memory pool (the runtime's), kept for it.
// A pass that needs the host in the middle cannot be replayed, and capturing it fails with
// the reason: a host read (a mixture of experts' token counts), a random stream (dropout:
// the replay would reuse the capture step's masks), a metric report. Forward contexts see
// set_capturing(true) and name the module's request.
//
// The trainer uses this pass only on one process with one model chunk and no overlapped
// gradient reduction (Trainer checks and says so), after cuda_graph_warmup_steps direct
// steps, so that kernels' lazily made plans and buffers exist before the capture.
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/data_source.h"
#include "core/plugin/host.h"
#include "core/train/schedule_executor.h"
#include "loom/kinds/model.h"

namespace loom::core {

/// The runtime of `device` when it captures graphs (device_runtime 1.1); else throws
/// InvalidArgument naming /train/cuda_graph and its value `mode` ("forward_backward").
IDeviceRuntime& graph_runtime(Host& host, Device device, const char* mode);

class GraphedPass {
 public:
  /// \param host    the core's host: its runtime for `device` must be device_runtime 1.1
  /// \param device  where the model runs (not the CPU)
  /// \param model   the whole model (one chunk, first and last stage)
  /// \param mode    the value of /train/cuda_graph, for messages
  /// Throws InvalidArgument naming /train/cuda_graph when the device cannot capture graphs.
  GraphedPass(Host& host, Device device, IModel& model, const char* mode);
  ~GraphedPass();
  GraphedPass(const GraphedPass&) = delete;
  GraphedPass& operator=(const GraphedPass&) = delete;

  /// Runs the step's `micro_batches` forward and backward passes (captured at the first
  /// call, replayed from then on), calling step.after_backward after each, and returns
  /// their losses as ScheduleExecutor::run does. Throws, naming /train/cuda_graph, when
  /// the pass cannot be captured or a micro-batch's shape differs from the captured one.
  StepLosses run(int32_t micro_batches, const StepPlanContext& step);

  /// Replays so far (for the log and tests).
  int64_t replays() const { return replays_; }

  /// Whether run(micro_batches, step) overwrites the weight gradients' first writes
  /// (grad_first_write): the captured graph's answer once it exists, else whether the
  /// capture will (one micro-batch a step, and `step` gives claims).
  bool overwrites(int32_t micro_batches, const StepPlanContext& step) const {
    return graph_ != nullptr ? overwrites_
                             : micro_batches == 1 && static_cast<bool>(step.grad_first_write);
  }

 private:
  // The static inputs of the captured pass, shaped as the first micro-batch was.
  struct Shape {
    int64_t batch = 0, seq_length = 0;
    bool positions = false, segments = false;
    bool operator==(const Shape&) const = default;
  };
  void allocate_buffers(const Shape& shape);
  void load(const Batch& batch, double loss_weight);
  void capture(int32_t rng_index, const StepPlanContext& step);
  // The pass the graph holds: forward on the static inputs, the loss copied out, backward.
  void pass(ForwardContext& ctx);
  TensorView buffer(int which, DType dtype, std::vector<int64_t> shape) const;

  Host& host_;
  Device device_;
  IModel& model_;
  IDeviceRuntime& runtime_;
  void* graph_ = nullptr;
  Shape shape_{};
  // tokens, labels, loss mask, positions, segments, loss gradient, loss: parts of one
  // device block (null: absent), and the host's image of all but the loss.
  static constexpr int kBuffers = 7;
  void* block_ = nullptr;
  void* buffers_[kBuffers] = {};
  std::vector<char> staging_;
  int64_t replays_ = 0;
  bool overwrites_ = false;  // captured with grad_first_write claims (one micro-batch a step)
};

}  // namespace loom::core
