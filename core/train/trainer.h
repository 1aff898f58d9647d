// Trainer: one rank's training run (DESIGN.md sections 4, 6 and 8). It keeps construction,
// the orchestration of a step, evaluation and the run loop; the jobs around them live in
// their own pieces:
//   RunConfig            the spec's core sections, typed and validated (run_config.h)
//   data                 the data source from /data (core/data/data_factory.h)
//   kernels              the kernel libraries and pins (core/plugin/kernel_libraries.h)
//   DistributedOptimizer master weights, optimizer states, gradient reduction, norm,
//                        clipping, the update, their checkpoint tensors (core/optim)
//   ScheduleExecutor     the plan of the step's forward and backward passes (and, with
//                        pipeline parallelism, the transfers between stages)
//   LossScaler           dynamic loss scaling for f16 (loss_scaler.h)
//   StepMetrics          the modules' metrics (step_metrics.h)
//   Progress             the log line, metrics.jsonl, the progress bar (progress.h)
// A step: the plan runs the micro-batches' forward and backward passes (the last one hands
// gradient buckets to the reduction as they become final), the reduction finishes, the
// gradient norm decides whether the step is taken, the optimizer updates, the FP8 recipe
// and every module see the step's end.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/data/data_source.h"
#include "core/optim/distributed_optimizer.h"
#include "core/parallel/parallel_state.h"
#include "core/plugin/plugin_manager.h"
#include "core/runtime/parameters.h"
#include "core/train/components.h"
#include "core/train/graphed_pass.h"
#include "core/train/graphed_update.h"
#include "core/train/loss_scaler.h"
#include "core/train/memory_estimate.h"
#include "core/train/progress.h"
#include "core/train/result_validator.h"
#include "core/train/run_config.h"
#include "core/train/schedule_executor.h"
#include "core/train/step_metrics.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds/model.h"
#include "loom/kinds/optimizer.h"

namespace loom::core {

/// Options of `Trainer::run`.
struct RunOptions {
  std::filesystem::path run_dir;           ///< metrics.jsonl goes here; empty for none
  int64_t steps = -1;                      ///< overrides /train/steps when >= 0
  bool evaluate = true;                    ///< run validation at eval_interval and at the end
  CheckpointWriter* checkpoint = nullptr;  ///< where saves go; null: never save
  int64_t save_interval = 0;               ///< save every this many steps (0: never)
  bool save_at_end = true;                 ///< save when the last step is done
  /// Polled after every step: when non-zero (a signal number), the run saves and returns.
  const std::atomic<int>* stop_signal = nullptr;
};

/// How `Trainer::run` ended.
struct RunResult {
  int64_t iteration = 0;  ///< steps taken in total (resumed ones included)
  int stop_signal = 0;    ///< the signal that stopped it early, or 0
  std::optional<std::filesystem::path> checkpoint;  ///< the last checkpoint saved, if any
};

class Trainer {
 public:
  /// \param spec      the resolved spec (defaults filled in)
  /// \param plugins   loaded plugins; the device's kernel library is loaded here
  /// \param data      the data source, or null to make one from /data
  /// \param model_inherited  extra options handed to the model (e.g. return_logits)
  /// \param parallel  this rank's place in a multi-process run, or null for one process;
  ///                  must outlive the trainer
  Trainer(const nlohmann::json& spec, PluginManager& plugins,
          std::unique_ptr<DataSource> data = nullptr,
          const nlohmann::json& model_inherited = nlohmann::json::object(),
          ParallelState* parallel = nullptr);
  ~Trainer();

  /// Prints the layout, parameter count, data source and kernels.
  void print_banner(std::FILE* out) const;
  /// Runs the loop with a log line every /train/log_interval steps, saving checkpoints as
  /// `options` says.
  RunResult run(const RunOptions& options);
  /// One optimizer step over the global batch.
  StepResult step();
  /// Mean loss over /train/eval_steps validation batches; NaN when the data has none.
  double evaluate();

  /// Forward and backward of one batch (a plan of one micro-batch); the loss gradient is
  /// `loss_weight`. Returns the loss. When the model returns logits and `logits` is
  /// non-null, copies them out (B*T*V floats: a padded vocabulary's padding left out).
  /// `micro_batch` keys the random streams (dropout) of this micro-batch within the step.
  double forward_backward(const Batch& batch, double loss_weight,
                          std::vector<float>* logits = nullptr, int32_t micro_batch = 0);
  /// Forward only (no dropout, nothing saved).
  double forward_only(const Batch& batch, std::vector<float>* logits = nullptr);

  /// What a checkpoint of this trainer holds: model weights ("model.<name>", parameter
  /// dtype), f32 master weights when parameters are not f32 ("optim.master.<name>") and
  /// the optimizer's states ("optim.<state>.<name>"), and the FP8 recipe's state.
  /// Collective over the data groups with the distributed optimizer (its states are
  /// gathered first); the first data-parallel rank returns the tensors, or its
  /// tensor-parallel slices of them (each replicated tensor once, from tp rank 0), the
  /// other ranks nothing.
  std::vector<SaveTensor> checkpoint_tensors();
  /// The checkpoint metadata: resolved spec, trainer state (loss scaling, data position,
  /// RNG scheme), plugins with their file hashes, loom version.
  nlohmann::json checkpoint_metadata() const;
  /// Restores everything checkpoint_tensors/metadata saved: weights, master weights,
  /// optimizer states, iteration, loss scaling and the data position. Throws naming the
  /// checkpoint and tensor when the checkpoint does not fit this model or optimizer.
  void restore(CheckpointReader& reader);
  /// Loads model weights only (checkpoint.init_from); the optimizer starts fresh.
  void load_weights(CheckpointReader& reader);
  /// The tokenizer of the data, when it has one (saved with checkpoints for generation).
  const std::optional<std::filesystem::path>& tokenizer_path() const { return tokenizer_path_; }

  IModel& model() { return *model_; }
  ParameterSet& params() { return *params_; }
  DataSource& data() { return *data_; }
  const RunConfig& config() const { return config_; }
  int64_t iteration() const { return iteration_; }
  /// Model FLOPs of one step (the model's cost, model 1.1) and the measured GEMM peak
  /// (FLOP/s) of every rank together.
  double flops_per_step() const { return flops_per_step_; }
  double peak_flops() const { return peak_flops_; }
  /// Peak memory of the training device since start or the last reset_memory_peak: the CPU
  /// allocator's on the CPU, the device runtime's allocated peak on a device.
  uint64_t peak_memory() const;
  /// Collective over every rank: writes the traced steps of a pipelined run (steps 2 to
  /// 1 + /log/trace_steps) to dir/pipeline_trace.json (run() does at its end; `loom bench
  /// --trace DIR` too).
  void write_trace(const std::filesystem::path& dir);
  /// Starts a new peak-memory phase (e.g. after warm-up).
  void reset_memory_peak();
  /// The analytic estimate of this rank's peak (memory_estimate.h): weights, gradients,
  /// master weights and optimizer states as allocated, activations as the model says.
  MemoryEstimate memory_estimate() const;
  /// The training device.
  Device device() const { return device_; }

 private:
  // The plan of one step (the schedule's, or the built-in one without pipelining).
  std::vector<PipelineAction> plan(int32_t micro_batches) const;
  // Whether modules keep their FP8 weights for a step's other micro-batches
  // (StepPlanContext::param_version nonzero): FP8, /precision/fp8_weight_cache, several
  // micro-batches a step, and no /train/cuda_graph (a replay cannot skip the quantisation
  // for one micro-batch and not for another).
  bool caches_fp8_weights() const;
  // The schedule's name for messages: its impl, or "no_pipelining" (the built-in plan).
  std::string schedule_name() const;
  // The step's context for the executor, reading micro-batches from the data.
  StepPlanContext step_context(std::vector<Batch>& batches, int64_t start, double loss_weight);
  // Sum over every rank of the f64 `value` in `role`'s group (one process: the value).
  double sum_over(ParallelRole role, double value);
  // The FP8 recipe's state tensor `index` as ("fp8.<name>", its view on the device).
  std::pair<std::string, TensorView> fp8_state(int32_t index) const;
  // Where this rank's FP8 state sits in the checkpoint's: each virtual pipeline stage holds
  // its own layers' quantisers, so the checkpoint concatenates the stages' per-quantiser
  // tensors along their quantiser dimension (fp8_recipe 1.2) in virtual-stage order (chunk
  // c of stage r is virtual stage c x pp + r): the whole model's build order.
  struct Fp8StateLayout {
    std::vector<int32_t> dims;  ///< each state tensor's quantiser dimension, or -1
    int64_t local = 0;          ///< this rank's quantisers (every chunk's)
    int64_t total = 0;          ///< every stage's
    struct Chunk {
      int64_t first = 0;   ///< its first quantiser among this rank's
      int64_t count = 0;   ///< its quantisers
      int64_t offset = 0;  ///< its first among the checkpoint's
    };
    std::vector<Chunk> chunks;  ///< this rank's chunks, in chunk order
  };
  // Collective over the pipeline group on its first call (every rank calls it: checkpoint
  // saves and restores are collective).
  const Fp8StateLayout& fp8_state_layout();
  // The FP8 state as checkpoint slices in host memory (kept in checkpoint_bytes_): what this
  // rank writes of it (fp8_state_layout; tp and dp rank 0 of each stage, and stage 0 alone
  // for a tensor that is not per quantiser).
  void append_fp8_state(std::vector<SaveTensor>& out);
  // Reads the FP8 recipe's state from a checkpoint (a warning when it holds none).
  void restore_fp8(CheckpointReader& reader);
  /// Collective over the amax group: throws when a rank's FP8 state differs from rank 0's.
  void check_fp8_state_agrees();
  // A pipelined step's timed actions: its measured bubble into the metrics, and its actions
  // into the trace when the step is traced (/log/trace_steps).
  void record_timeline(const std::vector<TimedAction>& timeline, int64_t step);
  // Calls every module's step_end (module kinds 1.1) after step `r`.
  void end_step_of_modules(const StepResult& r);
  ICommunicator& group(ParallelRole role) const;

  const nlohmann::json spec_;
  const RunConfig config_;
  PluginManager& plugins_;
  ParallelState* parallel_ = nullptr;
  int data_replicas_ = 1, data_rank_ = 0, tp_rank_ = 0, pp_rank_ = 0;
  SplitRanks split_ranks_;  ///< where this rank's parameter slices start (tp, etp)
  // Elements of the whole model (tensor-parallel slices counted whole, every stage's).
  int64_t model_numel_ = 0;
  std::chrono::steady_clock::time_point trace_origin_ = std::chrono::steady_clock::now();
  std::vector<TimedAction> trace_;  // the traced steps' actions (rank: the global rank)
  std::vector<std::vector<uint64_t>> checkpoint_bytes_;  // device tensors staged on the host
  Device device_;
  RunComponents components_;   // destroyed after everything below that uses them
  IFp8Recipe* fp8_ = nullptr;  ///< spec /precision/fp8; null without FP8
  std::optional<Fp8StateLayout> fp8_layout_;  ///< fp8_state_layout, once asked
  IModel* model_ = nullptr;
  IOptimizer* optimizer_ = nullptr;
  ILrSchedule* schedule_ = nullptr;
  IPipelineSchedule* pipeline_schedule_ = nullptr;
  std::unique_ptr<ParameterSet> params_;
  std::unique_ptr<DistributedOptimizer> optim_;
  std::unique_ptr<ScheduleExecutor> executor_;
  /// /train/cuda_graph "forward_backward": the captured pass, used after the warm-up.
  std::unique_ptr<GraphedPass> graphed_;
  /// /train/cuda_graph "step": the captured optimizer's step, used with graphed_.
  std::unique_ptr<GraphedUpdate> graphed_update_;
  int64_t direct_steps_ = 0;  ///< steps this process ran without the graph (the warm-up)
  /// A weight gradient's first write of a step overwrites it (IForwardContext::
  /// grad_first_write); LOOM_GRAD_FIRST_WRITE=off makes every write add, to compare.
  bool grad_first_write_ = true;
  std::unique_ptr<StepMetrics> metrics_;
  std::unique_ptr<DataSource> data_;
  LossScaler scaler_;
  ResultValidator validator_;  ///< /train/rerun_mode
  bool return_logits_ = false;
  int64_t vocab_size_ = 0;  // the model's V (ModelInfo): logits are copied out with V columns
  /// A StepPlanContext::logits sink that copies (B, T, V) floats into `out`.
  std::function<void(int32_t, const TensorView&)> logits_into(std::vector<float>* out);
  int64_t iteration_ = 0;
  int64_t nonfinite_in_a_row_ = 0;
  double flops_per_step_ = 0, peak_flops_ = 0, activation_bytes_ = -1;
  std::string device_name_;
  std::string data_description_;
  std::optional<std::filesystem::path> tokenizer_path_;
  mutable nlohmann::json plugin_hashes_;  // computed on the first save
};

}  // namespace loom::core
