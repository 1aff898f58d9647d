// Trainer: one training run on one process (DESIGN.md sections 4, 6 and 8).
//
// It builds the model, optimizer and LR schedule from the resolved spec through the
// registry, allocates parameters (and f32 master weights when parameters are bf16/f16),
// then runs steps: gradient accumulation over micro-batches, dynamic loss scaling for
// f16, the global gradient norm and clipping, the optimizer on every parameter, and the
// cast back to the parameter dtype. `run` adds logging, evaluation and metrics.jsonl.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/build/builder.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/data/data_source.h"
#include "core/parallel/bucket_readiness.h"
#include "core/parallel/grad_sync.h"
#include "core/parallel/parallel_state.h"
#include "core/plugin/plugin_manager.h"
#include "core/runtime/forward_context.h"
#include "core/runtime/parameters.h"
#include "core/train/memory_estimate.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds/model.h"
#include "loom/kinds/optimizer.h"

namespace loom::core {

/// What one optimizer step did.
struct StepResult {
  int64_t step = 0;         ///< 1-based step just taken (or skipped)
  double loss = 0;          ///< mean of the micro-batch losses
  double grad_norm = 0;     ///< global L2 norm of the (unscaled, unclipped) gradients
  double lr = 0;            ///< learning rate used
  double loss_scale = 1;    ///< loss scale used (f16), else 1
  bool skipped = false;     ///< non-finite gradients or loss: no update
  double seconds = 0;       ///< wall time of the step
  double comm_seconds = 0;  ///< of which the training thread spent blocked in communication
  int64_t tokens = 0;       ///< tokens processed (by every data-parallel rank together)
};

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

  /// Forward and backward of one batch; the loss gradient is `loss_weight` (the trainer
  /// passes loss_scale / micro-batches). Returns the loss. When the model returns logits
  /// and `logits` is non-null, copies them out (B*T*V floats).
  /// `micro_batch` keys the random streams (dropout) of this micro-batch within the step.
  /// `last`: the step's last micro-batch, whose backward hands gradient buckets to the
  /// reduction as they become final (parallel.overlap_grad_reduce).
  double forward_backward(const Batch& batch, double loss_weight,
                          std::vector<float>* logits = nullptr, int32_t micro_batch = 0,
                          bool last = false);
  /// Forward only (no dropout, nothing saved).
  double forward_only(const Batch& batch, std::vector<float>* logits = nullptr);

  /// What a checkpoint of this trainer holds: model weights ("model.<name>", parameter
  /// dtype), f32 master weights when parameters are not f32 ("optim.master.<name>") and
  /// the optimizer's states ("optim.<state>.<name>"), as views of live memory.
  /// Collective over the dp group with the distributed optimizer (its states are gathered
  /// first); data-parallel rank 0 returns the tensors, or its tensor-parallel slices of
  /// them (each replicated tensor once, from tp rank 0), the other ranks nothing.
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
  int64_t iteration() const { return iteration_; }
  /// Model FLOPs of one step (see flops.h) and the measured GEMM peak (FLOP/s).
  double flops_per_step() const { return flops_per_step_; }
  double peak_flops() const { return peak_flops_; }
  /// Peak memory of the training device since start or the last reset_memory_peak: the CPU
  /// allocator's on the CPU, the device runtime's allocated peak on a device.
  uint64_t peak_memory() const;
  /// Starts a new peak-memory phase (e.g. after warm-up).
  void reset_memory_peak();
  /// The analytic estimate of this rank's peak (memory_estimate.h): weights, gradients,
  /// master weights and optimizer states as allocated, activations by the formula.
  MemoryEstimate memory_estimate() const;
  /// The training device.
  Device device() const { return device_; }

 private:
  /// Frees the master weights and optimizer states (destructor, failed constructor).
  void release_states();
  /// The spec's train.recompute as a policy.
  RecomputePolicy recompute_policy() const;
  // Optimizer memory of one segment (a whole parameter, or with the distributed optimizer
  // the part of it this rank updates): f32 master weights (the parameter itself when it is
  // f32) and the optimizer's state tensors.
  struct ParamState {
    Parameter* param = nullptr;
    Segment segment;
    TensorView master{};             // f32 (n,)
    std::vector<TensorView> states;  // f32 (n,) each
    std::vector<void*> owned;        // host allocations to free
    bool decay = true;
    bool in_norm = true;  // counted in the grad norm on this rank (replicas count once)
  };
  /// The optimizer step of every non-frozen shard: update_many (optimizer 1.1), with the
  /// casts into non-f32 parameters fused.
  void update_all(const OptimizerStep& hp);
  /// The same for an optimizer built against optimizer 1.0: update per shard, then a cast.
  void update_each(const OptimizerStep& hp);
  /// The parameter's own memory of a shard: (segment.length) in the parameter's dtype.
  TensorView param_shard(const ParamState& st) const;
  /// Sum over every rank of the f64 `value` in group `dims` (one process: the value).
  double sum_over(const char* dims, double value);
  /// All-reduces the gradients of bucket `b`'s sequence-parallel parameters over the tp
  /// group.
  void reduce_sequence_parallel_grads(size_t b);
  /// Bucket `b`'s gradients are final: its sequence-parallel ones over tp, then the
  /// data-parallel reduction (issued now, waited for in GradSync::finish).
  void reduce_bucket(size_t b);
  double run_forward(ForwardContext& ctx, const Batch& batch, std::vector<float>* logits);
  double loss_scale() const { return loss_scale_; }
  void update_loss_scale(bool overflow);
  double lr_at(int64_t step) const;

  const nlohmann::json spec_;
  PluginManager& plugins_;
  ParallelState* parallel_ = nullptr;
  int64_t dp_size_ = 1, dp_rank_ = 0, tp_rank_ = 0;
  std::vector<std::vector<float>> checkpoint_scratch_;   // gathered optimizer states
  std::vector<std::vector<uint64_t>> checkpoint_bytes_;  // device tensors staged on the host
  /// The FP8 recipe's state tensor `index` as ("fp8.<name>", its view on the device).
  std::pair<std::string, TensorView> fp8_state(int32_t index) const;
  /// Reads the FP8 recipe's state from a checkpoint (a warning when it holds none).
  void restore_fp8(CheckpointReader& reader);
  /// Elements of the whole model (tensor-parallel slices counted whole).
  int64_t model_numel() const;
  std::unique_ptr<GradSync> grad_sync_;
  std::unique_ptr<BucketReadiness> readiness_;
  bool overlap_ = false;  // hand buckets over during the last backward of a step
  Device device_;
  DType params_dtype_;
  // The FP8 recipe first: the model's modules hold it, so it is destroyed after them.
  ObjectPtr fp8_object_;
  IFp8Recipe* fp8_ = nullptr;  ///< spec /precision/fp8; null without FP8
  ObjectPtr model_object_, optimizer_object_, schedule_object_;
  IModel* model_ = nullptr;
  IOptimizer* optimizer_ = nullptr;
  ILrSchedule* schedule_ = nullptr;
  std::unique_ptr<ParameterSet> params_;
  std::vector<std::unique_ptr<ParamState>> states_;
  std::unique_ptr<DataSource> data_;
  Kernel sumsq_, cast_;
  int64_t micro_batch_, seq_length_, micro_batches_;
  double weight_decay_ = 0, constant_lr_ = 0, grad_clip_ = 0;
  bool return_logits_ = false;
  int64_t iteration_ = 0;
  int64_t nonfinite_in_a_row_ = 0;
  // Dynamic loss scaling (f16 only).
  bool dynamic_scaling_ = false;
  double loss_scale_ = 1, min_loss_scale_ = 1;
  int64_t scale_window_ = 1000, hysteresis_ = 2, hysteresis_left_ = 2, good_steps_ = 0;
  double flops_per_step_ = 0, peak_flops_ = 0;
  std::string device_name_;
  void* norm_acc_ = nullptr;  // (1) f64 on a device: the gradient norm's sum of squares
  std::string data_description_;
  std::optional<std::filesystem::path> tokenizer_path_;
  mutable nlohmann::json plugin_hashes_;  // computed on the first save
};

}  // namespace loom::core
