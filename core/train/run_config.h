// RunConfig: the core's spec sections (parallel, precision, train, checkpoint, kernels, log)
// as one typed value, read and validated once, after the spec was resolved (defaults filled
// in by the core schema, core/spec/core_schema.cc). The trainer, the run session and the
// command line read these fields, never the raw JSON of those sections; component nodes
// (model, optimizer, schedules, formats, backends, FP8 recipe) stay JSON for their factories.
//
// from_spec checks the rules that involve several fields (Megatron's
// TransformerConfig.__post_init__ style): sequence parallelism against the sequence length,
// the checkpoint format against layouts whose ranks save together, and what this loom
// cannot run yet; check_batch the batch sizes against the data-parallel size. Each broken
// rule is one SpecError naming the field and the fix.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/plugin/kernel_libraries.h"
#include "loom/kinds/module.h"
#include "loom/types.h"

namespace loom::core {

struct ParallelConfig {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;  ///< the process grid (Megatron's order)
  int etp = 0;                                 ///< expert tensor parallel; 0: tp
  int vpp = 1;                                 ///< virtual pipeline chunks per pipeline rank
  std::string cp_comm_type = "p2p";            ///< context parallel attention: p2p, all_gather
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  bool overlap_grad_reduce = true;
  int64_t bucket_size = 0;  ///< elements per gradient bucket (0: one bucket)
  double timeout_s = 300;
  /// How the layers split over the pipeline's virtual stages, as a model's "pipeline"
  /// option takes it (loom/cpp/nn/pipeline_stage.h): "layout", "first_stage_layers",
  /// "last_stage_layers", "account_for_embedding", "account_for_loss" as the spec sets them.
  nlohmann::json pipeline_split = nlohmann::json::object();
  nlohmann::json pipeline_schedule;    ///< component node, or null for the built-in plan
  nlohmann::json comm_backend;         ///< component node, or null (one process)
  nlohmann::json device_comm_backend;  ///< component node, or null

  /// tp x cp x ep x dp x pp.
  int world() const { return tp * cp * ep * dp * pp; }
  /// The grid's sizes in ProcessGrid's order.
  std::array<int, 5> grid_sizes() const { return {tp, cp, ep, dp, pp}; }
  /// Ranks that read different micro-batches (ep x dp; context-parallel ranks share theirs).
  int batch_replicas() const { return ep * dp; }
  /// Tensor, pipeline and expert parallelism and the distributed optimizer spread parameters or
  /// optimizer states over the ranks, which then save checkpoints together, each its
  /// slices; otherwise the first rank holds everything and saves alone.
  bool saves_together() const {
    return tp > 1 || pp > 1 || ep > 1 || etp > 1 || (dp > 1 && distributed_optimizer);
  }
  /// "tp=2 cp=1 ep=1 dp=2 pp=1".
  std::string describe() const;
};

struct PrecisionConfig {
  DType params = DType::kF32;  ///< parameters and activations
  double initial_loss_scale = 65536, min_loss_scale = 1;
  int64_t loss_scale_window = 1000, hysteresis = 2;
  nlohmann::json fp8;  ///< the FP8 recipe's component node, or null
  /// FP8 copies of the weights made once a step and kept for its other micro-batches
  /// (/precision/fp8_weight_cache: IForwardContext::param_version).
  bool fp8_weight_cache = true;
  /// Dynamic loss scaling (f16 parameters).
  bool dynamic_loss_scaling() const { return params == DType::kF16; }
};

struct TrainConfig {
  int64_t steps = 1000;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 1;  ///< resolved: micro_batch_size x batch replicas when unset
  int64_t seq_length = 1024;
  uint64_t seed = 1234;
  std::string device_name = "cpu";  ///< the spec's /train/device
  DeviceType device = DeviceType::kCpu;
  double grad_clip = 1.0;
  int64_t log_interval = 10, eval_interval = 100, eval_steps = 10;
  int64_t max_nonfinite_steps = 3;
  /// Result validation (Megatron's rerun state machine): rerun a step whose loss or
  /// gradient norm is non-finite, or (check_for_spiky_loss) whose loss is spiky.
  bool validate_results = false;
  bool check_for_spiky_loss = false;
  double spiky_loss_factor = 10;
  int64_t spiky_loss_samples = 100;
  RecomputePolicy recompute = RecomputePolicy::kNone;
  /// /train/cuda_graph "forward_backward" or "step": each micro-batch's forward and backward
  /// replayed as one captured device graph after `cuda_graph_warmup_steps` direct steps.
  bool cuda_graph = false;
  /// /train/cuda_graph "step": the optimizer's part of the step (gradient norm, clipping,
  /// update) replayed as a second graph as well.
  bool cuda_graph_update = false;
  int64_t cuda_graph_warmup_steps = 3;
};

struct CheckpointConfig {
  nlohmann::json format;  ///< component node ({"impl": "sharded"} unless the spec says)
  std::string dir;        ///< empty: <run_dir>/checkpoints
  int64_t interval = 0;   ///< save every this many steps; 0: only at the end
  int64_t keep = 3;
  bool resume_auto = false;
  bool async = false;
  bool save_at_end = true;
  std::string init_from;  ///< empty: none
};

struct LogConfig {
  std::string level = "info";
  std::string run_dir;          ///< empty: runs/<spec name>
  int64_t trace_steps = 3;      ///< steps from step 2 traced into pipeline_trace.json (pp > 1)
  double straggler_factor = 2;  ///< slowest / fastest rank's compute time that is reported
  nlohmann::json sample;        ///< /log/sample, or null
};

struct RunConfig {
  ParallelConfig parallel;
  PrecisionConfig precision;
  TrainConfig train;
  CheckpointConfig checkpoint;
  KernelsConfig kernels;
  LogConfig log;

  /// Micro-batches per optimizer step on each data-parallel rank.
  int64_t micro_batches() const {
    return train.global_batch_size / (train.micro_batch_size * parallel.batch_replicas());
  }

  /// Reads a resolved spec's core sections and checks the rules above but the batch's.
  /// Throws SpecError (Error kUnimplemented for a layout this loom cannot run).
  static RunConfig from_spec(const nlohmann::json& spec);
  /// The batch's rule: global_batch_size a multiple of micro_batch_size x the data-parallel
  /// replicas. Checked by the trainer, after the run's ranks were checked against the layout
  /// (a layout that does not fit the ranks is the first thing to say).
  void check_batch() const;
};

}  // namespace loom::core
