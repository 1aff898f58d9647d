// ScheduleExecutor: runs one optimizer step's plan of pipeline actions on this rank
// (loom/kinds/pipeline_schedule.h: forward, backward or its split halves, and the sends and
// receives between stages, per micro-batch and virtual chunk), whatever schedule made the
// plan: the built-in "no pipelining" (no_pipelining.h) or a pipeline_schedule plugin. The
// trainer owns the data, the optimizer and the step; the executor owns the micro-batches in
// flight: one forward context per (micro-batch, chunk) from its first use to its last
// backward, the activations and gradients that cross stage boundaries, and the loss.
//
// A plan is checked whole before anything runs: every (micro-batch, chunk) is forwarded
// once and then backwarded once (or split into backward_input, then backward_weight); a
// stage that is not the first receives its input before its forward and, after its
// backward, sends the input gradient back; one that is not the last sends its output after
// the forward and receives the output gradient before the backward. A plan that breaks a
// rule is refused with the action's index and the rule.
//
// The loss: the last stage's model gives each micro-batch's mean (outputs[0]) and, with
// context parallelism, its (sum, tokens) (model 1.1) summed over the context group into the
// micro-batch's mean; each micro-batch's loss gradient is `loss_weight` (its share of the
// step's loss) scaled by the rank's share of the micro-batch's tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/data/data_source.h"
#include "core/runtime/forward_context.h"
#include "core/train/plan_simulator.h"
#include "loom/host.h"
#include "loom/kinds/comm_backend.h"
#include "loom/kinds/model.h"
#include "loom/kinds/pipeline_schedule.h"

namespace loom::core {

/// One micro-batch as the executor asks for it.
struct MicroBatchInput {
  const Batch* batch = nullptr;  ///< tokens, labels, mask, positions, segments (host memory)
  int32_t rng_index = 0;         ///< IForwardContext::micro_batch(): the random streams' key
};

/// What one step needs besides the plan.
struct StepPlanContext {
  /// Micro-batch m's data, asked for once, on its first use (in increasing m for every
  /// chunk); the batch must stay valid until the step ends.
  std::function<MicroBatchInput(int32_t micro_batch)> input;
  /// d(the step's loss) / d(a micro-batch's mean loss): loss scale / micro-batches.
  double loss_weight = 1;
  uint64_t seed = 0;  ///< the run's seed (random streams)
  int64_t step = 1;   ///< the 1-based step (random streams)
  RecomputePolicy recompute = RecomputePolicy::kNone;
  const std::unordered_map<const void*, uint64_t>* module_ids = nullptr;
  MetricSink* metrics = nullptr;  ///< where modules' metric reports go, or null
  /// Called with every grads_ready owner of the last gradient pass over each chunk (its last
  /// backward, backward_input or backward_weight: the gradients are final there, and the
  /// overlapped reduction starts); empty: none. Signals of earlier passes are dropped (a
  /// later pass may still add to those gradients); what is never signalled is reduced after
  /// the plan.
  std::function<void(const void*)> grads_ready;
  /// The step's claims of first gradient writes (IForwardContext::grad_first_write: the
  /// parameter set's ParameterSet::claim_grad); empty: every write adds.
  std::function<bool(const void*)> grad_first_write;
  /// The id of the step's parameter values (IForwardContext::param_version), given to every
  /// micro-batch's context; 0: modules keep nothing derived from the parameters across
  /// micro-batches.
  uint64_t param_version = 0;
  /// Called after each backward (or backward_input) of a micro-batch (test hooks).
  std::function<void(int32_t micro_batch)> after_backward;
  /// The logits of a micro-batch whose forward returned them (a model built with
  /// return_logits), or empty.
  std::function<void(int32_t micro_batch, const TensorView& logits)> logits;
  /// When set, every action of the plan is appended as it ends, with its start and end in
  /// seconds since `timeline_origin` and rank = this rank's pipeline stage (a receive: from
  /// when it was reached until its data arrived).
  std::vector<TimedAction>* timeline = nullptr;
  std::chrono::steady_clock::time_point timeline_origin{};
  ICommunicator* pipeline = nullptr;  ///< stage-to-stage sends and receives (null: no pp)
  ICommunicator* context = nullptr;   ///< the loss's (sum, tokens) (null or size 1: no cp)
};

/// The losses of a step on this rank.
struct StepLosses {
  double sum_of_means = 0;    ///< the micro-batches' mean losses, summed (last stage)
  int32_t micro_batches = 0;  ///< how many micro-batches ended here (0 off the last stage)
};

class ScheduleExecutor {
 public:
  /// \param host    allocator and copies
  /// \param device  where activations live
  /// \param chunks  this rank's model chunk for each virtual chunk (one without
  ///                interleaving); each says where it sits (IModel::info, model 1.1; a
  ///                model 1.0 is the whole network)
  ScheduleExecutor(IHost& host, Device device, std::vector<IModel*> chunks);

  /// Checks `plan` for `micro_batches` micro-batches (see the top of this file); throws
  /// Error(kInvalidArgument) naming the action and the rule.
  /// \param schedule  the schedule's name, for messages
  void check(const std::vector<PipelineAction>& plan, int32_t micro_batches,
             const std::string& schedule) const;
  /// Checks and runs `plan`. Throws naming the action when a pass or a transfer fails.
  StepLosses run(const std::vector<PipelineAction>& plan, int32_t micro_batches,
                 const StepPlanContext& step, const std::string& schedule);

  /// Forward only of one micro-batch through this rank's chunks in virtual-stage order (no
  /// dropout, nothing kept for backward), receiving each chunk's input from the previous
  /// stage and sending its output to the next over step.pipeline, blocking (evaluation and
  /// forward-only use). Collective over the pipeline group: every stage calls it for the
  /// same batch. Returns the micro-batch's mean loss on the rank that holds the last stage
  /// (summed over step.context with context parallelism), nullopt on the others. Uses
  /// step.seed, step.step, step.module_ids, step.pipeline, step.context and step.logits.
  std::optional<double> forward_only(const Batch& batch, const StepPlanContext& step);

  /// Where chunk `c` sits.
  const ModelInfo& info(int32_t chunk) const { return infos_[static_cast<size_t>(chunk)]; }

 private:
  struct InFlight;  // one (micro-batch, chunk) between its first action and its last
  // Opens micro-batch m's context (asking for its data on first use).
  void open(InFlight& f, int32_t m, const StepPlanContext& step);
  void forward(InFlight& f, int32_t m, int32_t c, const StepPlanContext& step, StepLosses& out);
  void backward(InFlight& f, int32_t c, bool split, bool last_for_chunk,
                const StepPlanContext& step);
  // Whether f's sends have finished (then its memory is freed).
  bool sends_done(InFlight& f);
  // Waits for f's sends, keeping the first failure in *first (null: dropped), and frees f.
  void drain(InFlight& f, Status* first);
  // Virtual stage of this rank's chunk (chunk * pp + pp rank), and the tag of a transfer
  // between virtual stages `sender` and its neighbour for micro-batch m.
  int32_t virtual_stage(int32_t chunk) const;
  int32_t tag(int32_t m, int32_t sender, bool gradient) const;
  // The inputs of chunk c's forward for `batch` in `ctx`: the batch's (B, T) tensors (with
  // context parallelism, this rank's chunks of them and the position ids that go with them)
  // and, for a stage that is not the first, `received`.
  void forward_inputs(ForwardContext& ctx, const Batch& batch, const TensorView& received,
                      const StepPlanContext& step, TensorView (&in)[6]) const;
  // The micro-batch's mean loss from a last stage's outputs, and this rank's share of its
  // gradient weight (`weight` scaled by its share of the tokens with context parallelism).
  std::pair<double, double> loss_of(IModel& model, const TensorView* outputs, double weight,
                                    const StepPlanContext& step) const;

  IHost& host_;
  Device device_;
  std::vector<IModel*> chunks_;
  std::vector<ModelInfo> infos_;
  std::vector<MicroBatchInput> inputs_;  // the step's micro-batches, by index
};

}  // namespace loom::core
