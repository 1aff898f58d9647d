#include "core/train/trainer.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "core/data/data_factory.h"
#include "core/launch/rank_env.h"
#include "core/plugin/kernel_libraries.h"
#include "core/runtime/forward_context.h"
#include "core/train/components.h"
#include "core/train/flops.h"
#include "core/train/no_pipelining.h"
#include "core/train/plan_rules.h"
#include "core/train/test_fault.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/gather_text.h"
#include "core/util/log.h"
#include "loom/kinds.h"
#include "loom/version.h"

namespace loom::core {

namespace {

// A parameter-values id never handed out before in this process (IForwardContext::
// param_version): trainers in one process (tests) never share one.
uint64_t next_param_version() {
  static std::atomic<uint64_t> last{0};
  return ++last;
}

uint64_t max_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

// The model's ModelInfo (model 1.1), or that of the whole network for an older model.
ModelInfo info_of(IModel& model) {
  ModelInfo info{};
  info.struct_size = sizeof(ModelInfo);
  info.pp_size = info.chunks = 1;
  info.first_stage = info.last_stage = 1;
  if (model.interface_info().minor >= 1) throw_if_error(model.info(&info), "the model's info");
  return info;
}

}  // namespace

Trainer::Trainer(const nlohmann::json& spec, PluginManager& plugins,
                 std::unique_ptr<DataSource> data, const nlohmann::json& model_inherited,
                 ParallelState* parallel)
    : spec_(spec),
      config_(RunConfig::from_spec(spec)),
      plugins_(plugins),
      parallel_(parallel),
      scaler_(config_.precision),
      validator_(config_.train.validate_results, config_.train.check_for_spiky_loss,
                 config_.train.spiky_loss_factor, config_.train.spiky_loss_samples,
                 config_.precision.dynamic_loss_scaling()) {
  const TrainConfig& train = config_.train;
  const ParallelConfig& par = config_.parallel;
  if (const char* env = std::getenv("LOOM_GRAD_FIRST_WRITE"); env != nullptr && *env != '\0') {
    const std::string mode = env;
    if (mode != "on" && mode != "off")
      throw InvalidArgument(
          fmt::format("LOOM_GRAD_FIRST_WRITE='{}' is not one of on, off (unset it for on)", mode));
    grad_first_write_ = mode == "on";
  }
  // One GPU per rank on a machine: local rank r trains on device r.
  device_ = train.device == DeviceType::kCuda
                ? Device{DeviceType::kCuda,
                         parallel_ != nullptr ? launch::detect_rank_env().local_rank : 0}
                : kCpu;
  if (parallel_ != nullptr) {
    // Ranks that read different micro-batches: the data-parallel ones (context-parallel
    // ranks share a micro-batch's tokens).
    GridGroup batch = parallel_->grid().group("ep,dp");
    data_replicas_ = batch.size();
    data_rank_ = batch.rank;
    tp_rank_ = parallel_->grid().coord("tp");
    pp_rank_ = parallel_->grid().coord("pp");
    if (parallel_->grid().size("dp") != par.dp)
      throw SpecError("/parallel/dp", fmt::format("{} differs from the process grid's dp {}",
                                                  par.dp, parallel_->grid().size("dp")));
  } else if (par.dp != 1) {
    throw SpecError("/parallel/dp",
                    fmt::format("{} needs {} processes; start them with `loom train --nproc N` or "
                                "`loom launch`",
                                par.dp, par.dp));
  }
  config_.check_batch();
  load_kernel_libraries(plugins_, config_.kernels, device_, "spec /train/device");

  // Data before the model: its errors (missing files, a corpus to prepare) come before
  // anything is built or allocated.
  DataPlan data_plan;
  if (!data) data_plan = plan_data(spec_["data"]);

  // The FP8 recipe, the model (its options checked against the data's tokenizer), the
  // optimizer, the LR schedule and a pipeline schedule.
  nlohmann::json inherited = model_inherited;
  if (data_plan.tokenizer_vocab > 0 && !inherited.contains("tokenizer_vocab_size"))
    inherited["tokenizer_vocab_size"] = data_plan.tokenizer_vocab;
  return_logits_ = inherited.value("return_logits", false);
  if (!spec_.contains("model"))
    throw SpecError("/model", "missing: training needs a model node {\"impl\": NAME, ...}");
  if (!spec_.contains("optimizer"))
    throw SpecError("/optimizer",
                    "missing: training needs an optimizer, e.g. {\"impl\": \"adamw\"}");
  components_ = build_components(spec_, config_, plugins_, inherited, pp_rank_);
  plugins_.host().check_pins();  // every plugin the model needs is loaded now
  fp8_ = components_.fp8;
  if (fp8_ != nullptr && config_.parallel.pp > 1 && fp8_->interface_info().minor < 2)
    throw Error(Code::kUnimplemented,
                fmt::format("spec /precision/fp8: the recipe '{}' predates fp8_recipe 1.2 (it "
                            "cannot say how its state splits over pipeline stages); rebuild it "
                            "against loom's SDK {} or train it with parallel.pp 1",
                            config_.precision.fp8.value("impl", std::string()), LOOM_ABI_STRING));
  model_ = components_.model;
  optimizer_ = components_.optimizer;
  schedule_ = components_.schedule;
  pipeline_schedule_ = components_.pipeline;
  const ModelInfo info = info_of(*model_);
  vocab_size_ = info.vocab_size;

  if (data) {
    data_ = std::move(data);
  } else {
    DataShape shape{train.micro_batch_size, train.seq_length, train.seed,
                    train.steps * train.global_batch_size,
                    train.eval_steps * train.micro_batch_size};
    data_ = make_data(data_plan, shape, info.vocab_size);
    tokenizer_path_ = data_plan.tokenizer;
  }
  data_description_ = data_->describe();

  BucketOptions buckets{par.bucket_size, group(ParallelRole::kData).size(),
                        group(ParallelRole::kExpertData).size()};
  std::vector<IModule*> roots(components_.chunks.begin(), components_.chunks.end());
  params_ = std::make_unique<ParameterSet>(plugins_.host(), roots, device_, buckets);

  OptimizerSetup setup{device_, config_.precision.params, par.distributed_optimizer,
                       par.overlap_grad_reduce && parallel_ != nullptr, tp_rank_};
  // The last pipeline stage's tied table is a copy of the first stage's (Megatron's
  // shared embedding): summed with it over the embedding group, counted once in the norm.
  setup.tied_replica = par.pp > 1 && pp_rank_ != 0;
  if (parallel_ != nullptr) {
    setup.expert_tp_rank = group(ParallelRole::kExpertTensor).rank();
    setup.expert_dp_rank = group(ParallelRole::kExpertData).rank();
  }
  split_ranks_ = setup.split_ranks();
  params_->initialize(train.seed, split_ranks_);
  bool local_experts = false;
  for (const Parameter& p : params_->all())
    local_experts = local_experts || (p.info.flags & kParamExpert) != 0;
  setup.experts = sum_over(ParallelRole::kWorld, local_experts ? 1.0 : 0.0) > 0;
  // On a device the kernels that wrote a bucket's gradients may still be queued when it
  // is handed over: the device's communicator orders its collectives after the work
  // queued on the compute stream (comm_nccl), so the reduction reads them finished.
  optim_ = std::make_unique<DistributedOptimizer>(
      plugins_.host(), *params_, *optimizer_, setup,
      [this](ParallelRole role) -> ICommunicator& { return group(role); });
  executor_ = std::make_unique<ScheduleExecutor>(plugins_.host(), device_, components_.chunks);
  if (train.cuda_graph) {
    // One process, one chunk: no collective or pipeline transfer inside the captured pass,
    // and no gradient hooks (the overlapped reduction needs more than one rank anyway).
    const char* mode = train.cuda_graph_update ? "step" : "forward_backward";
    if (parallel_ != nullptr)
      throw InvalidArgument(fmt::format(
          "/train/cuda_graph '{}' runs on one process for now; this run has {} "
          "(its collectives are not captured): set /train/cuda_graph to \"none\" or use one "
          "rank",
          mode, parallel_->grid().world_size()));
    if (components_.chunks.size() != 1)
      throw InvalidArgument(
          fmt::format("/train/cuda_graph '{}' captures one model chunk; this run has virtual "
                      "pipeline chunks: set /train/cuda_graph to \"none\"",
                      mode));
    graphed_ =
        std::make_unique<GraphedPass>(plugins_.host(), device_, *components_.chunks[0], mode);
  }
  if (train.cuda_graph_update) {
    // The update decides on the device what a direct step decides on the host: nothing may
    // need the norm on the host before the update.
    if (train.validate_results)
      throw InvalidArgument(
          "/train/cuda_graph 'step' decides on the device whether to update, where result "
          "validation (/train/rerun_mode \"validate_results\") needs the gradient norm on the "
          "host first: set /train/rerun_mode to \"disabled\" or /train/cuda_graph to "
          "\"forward_backward\"");
    if (setup.experts)
      throw InvalidArgument(
          "/train/cuda_graph 'step': the model has experts' parameters, whose gradient norm "
          "is summed apart on the host (and whose routing reads token counts on the host, "
          "which no graph replays): set /train/cuda_graph to \"none\"");
    graphed_update_ = std::make_unique<GraphedUpdate>(plugins_.host(), device_, *optim_,
                                                      *optimizer_, train.grad_clip);
  }
  metrics_ = std::make_unique<StepMetrics>(plugins_.host(), device_);

  // Elements of the whole model: this rank's (slices counted whole, the last stage's copy
  // of a tied table not at all), summed over the pipeline stages; the experts' on the one
  // rank of each expert's edp replicas that counts them, summed over every rank.
  int64_t local_numel = 0, expert_numel = 0;
  for (const Parameter& p : params_->all()) {
    if (setup.tied_replica && (p.info.flags & kParamTiedEmbedding) != 0) continue;
    int64_t whole = 1;
    for (int32_t d = 0; d < p.info.ndim; ++d) whole *= p.info.global_shape[d];
    if ((p.info.flags & kParamExpert) == 0)
      local_numel += whole;
    else if (setup.expert_dp_rank == 0 && setup.expert_tp_rank == 0)
      expert_numel += whole;
  }
  model_numel_ = local_numel;
  if (par.pp > 1)
    model_numel_ = static_cast<int64_t>(
        std::llround(sum_over(ParallelRole::kPipeline, static_cast<double>(local_numel))));
  if (setup.experts)
    model_numel_ += static_cast<int64_t>(
        std::llround(sum_over(ParallelRole::kWorld, static_cast<double>(expert_numel))));

  // Model FLOPs (what the model says it costs: each chunk its share, summed over the
  // pipeline stages) and the peak they are measured against. FLOPs count tokens of whole
  // sequences; activations are this rank's share of each (seq_length / cp tokens).
  auto model_cost = [&](int64_t seq_length) {
    CostQuery query{sizeof(CostQuery), train.micro_batch_size, seq_length, train.recompute,
                    fp8_ == nullptr        ? 0
                    : caches_fp8_weights() ? 2
                                           : 1};
    ModelCost sum{};
    bool known = true;  // every chunk counts its own FLOPs
    for (IModel* chunk : components_.chunks) {
      ModelCost cost{};
      cost.struct_size = sizeof(ModelCost);
      cost.activation_bytes = -1;
      if (chunk->interface_info().minor >= 1)
        throw_if_error(chunk->cost(&query, &cost), "the model's cost (IModel::cost)");
      known = known && cost.flops_per_token > 0;
      sum.flops_per_token += cost.flops_per_token;
      sum.activation_bytes = cost.activation_bytes >= 0 && sum.activation_bytes >= 0
                                 ? sum.activation_bytes + cost.activation_bytes
                                 : -1;
    }
    return std::pair{sum, known};
  };
  auto [whole, known] = model_cost(train.seq_length);
  double flops_per_token = whole.flops_per_token;
  const double activation_bytes = par.cp > 1
                                      ? model_cost(train.seq_length / par.cp).first.activation_bytes
                                      : whole.activation_bytes;
  if (par.pp > 1) flops_per_token = sum_over(ParallelRole::kPipeline, known ? flops_per_token : 0);
  if (par.pp > 1) known = sum_over(ParallelRole::kPipeline, known ? 0 : 1) == 0;
  // A model 1.0's count (or one that does not know): 6 per parameter.
  if (!known) flops_per_token = 6.0 * static_cast<double>(model_numel_);
  activation_bytes_ = activation_bytes;
  flops_per_step_ = flops_per_token *
                    static_cast<double>(train.micro_batch_size * train.seq_length) *
                    static_cast<double>(config_.micro_batches() * data_replicas_);
  if (device_.type == DeviceType::kCpu) {
    peak_flops_ = measure_gemm_peak(plugins_.host());
  } else {
    // A GPU's MFU is stated against its dense bf16 peak (Megatron's and llm.c's habit).
    DeviceProperties props{};
    throw_if_error(plugins_.host().runtime(device_).properties(device_.index, &props));
    peak_flops_ = props.peak_bf16_flops;
    device_name_ = props.name;
  }
  // MFU of a multi-process run is against the peak of every rank together.
  if (parallel_ != nullptr) peak_flops_ *= parallel_->grid().world_size();
}

Trainer::~Trainer() = default;

ICommunicator& Trainer::group(ParallelRole role) const {
  ICommunicator* comm = nullptr;
  throw_if_error(plugins_.host().group(role, &comm),
                 fmt::format("the {} parallel group", parallel_role_name(role)));
  return *comm;
}

bool Trainer::caches_fp8_weights() const {
  return fp8_ != nullptr && config_.precision.fp8_weight_cache && config_.micro_batches() > 1 &&
         graphed_ == nullptr;
}

uint64_t Trainer::peak_memory() const {
  if (device_.type == DeviceType::kCpu) return plugins_.host().cpu_memory().peak;
  return plugins_.host().device_memory(device_).peak_allocated;
}

void Trainer::reset_memory_peak() { plugins_.host().reset_peak(device_); }

MemoryEstimate Trainer::memory_estimate() const {
  MemoryEstimate e;
  for (const Parameter& p : params_->all()) {
    int64_t n = 1;
    for (int32_t d = 0; d < p.info.ndim; ++d) n *= p.info.shape[d];
    e.weights += static_cast<uint64_t>(n) * dtype_size(p.info.dtype);
  }
  e.grads = static_cast<uint64_t>(params_->flat_size()) * sizeof(float);
  e.master = optim_->master_bytes();
  e.optimizer = optim_->state_bytes();
  e.shard_buffers = optim_->shard_buffer_bytes();
  // The FP8 recipe's state as it allocates it (asking for it allocates it, as the first
  // quantisation would).
  if (fp8_ != nullptr)
    for (int32_t i = 0; i < fp8_->state_count(); ++i) e.fp8 += nbytes(fp8_state(i).second);
  if (activation_bytes_ >= 0) e.activations = static_cast<uint64_t>(activation_bytes_);
  // Experts on this rank: the model sized their rows for balanced routing (or the capacity).
  for (const Parameter& p : params_->all())
    e.routed = e.routed || (p.info.flags & kParamExpert) != 0;
  return e;
}

void Trainer::print_banner(std::FILE* out) const {
  int64_t tensors = static_cast<int64_t>(params_->all().size());
  std::string local =
      model_numel_ != params_->numel() ? fmt::format(", {} on this rank", params_->numel()) : "";
  std::fprintf(out, "  model: %s, %lld parameters in %lld tensors (%s%s)\n",
               spec_["model"]["impl"].get<std::string>().c_str(),
               static_cast<long long>(model_numel_), static_cast<long long>(tensors),
               dtype_name(config_.precision.params), local.c_str());
  std::fprintf(out, "  batch: %lld micro-batches of %lld x %lld tokens per step; %lld steps\n",
               static_cast<long long>(config_.micro_batches()),
               static_cast<long long>(config_.train.micro_batch_size),
               static_cast<long long>(config_.train.seq_length),
               static_cast<long long>(config_.train.steps));
  std::fprintf(out, "  data: %s\n", data_description_.c_str());
  if (device_.type == DeviceType::kCpu)
    std::fprintf(out,
                 "  model FLOPs per step: %.3g (the model's count); fp32 GEMM peak %.1f GFLOP/s\n",
                 flops_per_step_, peak_flops_ / 1e9);
  else
    std::fprintf(out,
                 "  model FLOPs per step: %.3g (the model's count); device %s, dense bf16 peak "
                 "%.1f TFLOP/s%s\n",
                 flops_per_step_, device_name_.c_str(), peak_flops_ / 1e12,
                 peak_flops_ > 0 ? "" : " (unknown: no MFU)");
  if (fp8_ != nullptr)
    std::fprintf(out, "  fp8: %s%s\n", config_.precision.fp8.dump().c_str(),
                 caches_fp8_weights()
                     ? fmt::format("; weights quantised once a step, kept for its {} micro-batches",
                                   config_.micro_batches())
                           .c_str()
                     : "");
  std::fprintf(out, "  memory estimate: %s\n", memory_estimate().describe().c_str());
  std::string kernels;
  for (const auto& r : plugins_.host().resolutions())
    kernels +=
        fmt::format("{}{}:{}={}", kernels.empty() ? "" : ", ", r.op, dtype_name(r.dtype), r.kernel);
  std::fprintf(out, "  kernels: %s\n", kernels.c_str());
  std::fflush(out);
}

std::vector<PipelineAction> Trainer::plan(int32_t micro_batches) const {
  if (pipeline_schedule_ == nullptr) return no_pipelining_plan(micro_batches);
  const ModelInfo& where = executor_->info(0);
  PipelineShape shape{sizeof(PipelineShape), where.pp_size, where.pp_rank, micro_batches,
                      where.chunks};
  int64_t count = 0;
  std::string name = schedule_name();
  throw_if_error(pipeline_schedule_->plan(&shape, nullptr, &count),
                 fmt::format("pipeline schedule '{}' (its plan's size)", name));
  std::vector<PipelineAction> actions(static_cast<size_t>(std::max<int64_t>(count, 0)));
  throw_if_error(pipeline_schedule_->plan(&shape, actions.data(), &count),
                 fmt::format("pipeline schedule '{}'", name));
  actions.resize(static_cast<size_t>(count));
  return actions;
}

std::string Trainer::schedule_name() const {
  return pipeline_schedule_ != nullptr ? config_.parallel.pipeline_schedule.value("impl", "?")
                                       : "no_pipelining";
}

StepPlanContext Trainer::step_context(std::vector<Batch>& batches, int64_t start,
                                      double loss_weight) {
  StepPlanContext step;
  // Data-parallel rank r reads micro-batch m of the step at samples (m * R + r) * B of
  // the global batch (R replicas), Megatron's order: one rank with R times the
  // micro-batches reads the same samples, and draws the same dropout masks (micro-batch
  // index m * R + r).
  const int64_t b = config_.train.micro_batch_size;
  step.input = [this, &batches, start, b](int32_t m) {
    if (data_replicas_ > 1 || data_->position() != start + m * b)
      data_->seek(start + (m * data_replicas_ + data_rank_) * b);
    data_->next_train(batches[static_cast<size_t>(m)]);
    return MicroBatchInput{&batches[static_cast<size_t>(m)], m * data_replicas_ + data_rank_};
  };
  step.loss_weight = loss_weight;
  step.seed = config_.train.seed;
  step.step = iteration_ + 1;
  step.recompute = config_.train.recompute;
  step.module_ids = &params_->module_ids();
  step.metrics = metrics_.get();
  if (optim_->overlap())
    step.grads_ready = [this](const void* owner) { optim_->grads_ready(owner); };
  if (grad_first_write_)
    step.grad_first_write = [this](const void* grad) { return params_->claim_grad(grad); };
  // A new id of the parameter values for each step (they change only between steps), under
  // which modules keep what they derive from them (FP8 weights) for the step's other
  // micro-batches; with one micro-batch there is nothing to share.
  if (caches_fp8_weights()) step.param_version = next_param_version();
  if (parallel_ != nullptr) {
    step.pipeline = &group(ParallelRole::kPipeline);
    step.context = &group(ParallelRole::kContext);
  }
  return step;
}

StepResult Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  StepResult r;
  r.step = iteration_ + 1;
  r.loss_scale = scaler_.scale();
  double comm_before = parallel_ != nullptr ? parallel_->stats().blocked_seconds() : 0;
  const int64_t micro_batches = config_.micro_batches();
  const int64_t start = data_->position();
  const int rank = parallel_ != nullptr ? parallel_->grid().rank() : 0;
  // Under /train/cuda_graph "step", the optimizer's part of the step replays its graph from
  // the step the passes' graph starts (GraphedUpdate).
  const bool graph_update =
      graphed_update_ != nullptr && direct_steps_ >= config_.train.cuda_graph_warmup_steps;
  // One run of the step's forward and backward passes, the gradient reduction and the
  // global loss and gradient norm; run again on the same data when result validation
  // rejects the first (`attempt` 1).
  auto run_passes = [&](int attempt) {
    if (attempt > 0) {
      data_->seek(start);
      metrics_->discard_step();
    }
    std::vector<Batch> batches(static_cast<size_t>(micro_batches));
    StepPlanContext step =
        step_context(batches, start, scaler_.scale() / static_cast<double>(micro_batches));
    if (test_fault_set())
      step.after_backward = [&](int32_t m) {
        if (m == 0) inject_fault_after_backward(rank, r.step);
      };
    // A pipeline's actions, timed: the step's measured bubble, and the trace.
    std::vector<TimedAction> timeline;
    const bool pipelined = config_.parallel.pp > 1;
    if (pipelined) {
      step.timeline = &timeline;
      step.timeline_origin = trace_origin_;
    }
    const bool graphed = graphed_ != nullptr && !step.logits &&
                         direct_steps_ >= config_.train.cuda_graph_warmup_steps;
    // The layers' weight gradients (kParamGradOverwrite) need no zero fill when their first
    // write of the step overwrites them (grad_first_write): not under a graph that adds at
    // every write (several micro-batches a step). What no write claimed is zeroed after the
    // passes (zero_unclaimed below), or, with the reduction overlapped with backward, before
    // its bucket goes out (DistributedOptimizer::grads_ready).
    const bool captures = graphed && graphed_->replays() == 0;
    const bool keep_overwrite =
        grad_first_write_ &&
        (!graphed || graphed_->overwrites(static_cast<int32_t>(micro_batches), step));
    optim_->begin_step(keep_overwrite);
    if (log_level() == LogLevel::kDebug && attempt == 0)
      log_debug("train", fmt::format("step {}: zero fill of {} of {} gradient elements (the "
                                     "rest: weight gradients that their first write overwrites)",
                                     r.step, params_->flat_size() - params_->kept_elements(),
                                     params_->flat_size()));
    if (test_fault_set()) inject_fault_after_zero_fill(rank, r.step, plugins_.host(), *params_);
    if (captures)
      log_info("cuda graph",
               graphed_update_ != nullptr
                   ? fmt::format("step {}: capturing the forward and backward, and the "
                                 "optimizer's step, after {} direct steps; replaying them from "
                                 "now on",
                                 r.step, direct_steps_)
                   : fmt::format("step {}: capturing the forward and backward after {} "
                                 "direct steps; replaying it from now on",
                                 r.step, direct_steps_));
    StepLosses losses =
        graphed ? graphed_->run(static_cast<int32_t>(micro_batches), step)
                : executor_->run(plan(static_cast<int32_t>(micro_batches)),
                                 static_cast<int32_t>(micro_batches), step, schedule_name());
    if (!graphed && attempt == 0) ++direct_steps_;
    // A kept gradient that got no write this step. A replay makes the capture's writes, whose
    // claims the host saw once: what the capture left unwritten was zeroed then and stays so.
    if (!graphed || captures) params_->zero_unclaimed();
    if (pipelined && attempt == 0) record_timeline(timeline, r.step);
    if (data_replicas_ > 1)
      data_->seek(start + micro_batches * data_replicas_ * config_.train.micro_batch_size);
    r.tokens = 0;
    for (const Batch& batch : batches) r.tokens += batch.batch * batch.seq_length * data_replicas_;
    r.loss = losses.sum_of_means / static_cast<double>(micro_batches);
    if (test_fault_set()) r.loss = inject_fault_into_loss(rank, r.step, attempt, r.loss);
    if (log_level() == LogLevel::kDebug && optim_->overlap())
      log_debug("parallel",
                fmt::format("step {}: {} of {} gradient buckets handed to the "
                            "reduction during backward",
                            r.step, optim_->released_buckets(), optim_->bucket_count()));
    optim_->finish_reduction();
    if (test_fault_set())
      inject_fault_after_reduction(rank, r.step, attempt, plugins_.host(), *params_);
    // The loss lives on the last pipeline stage; every data-parallel replica had its own.
    if (config_.parallel.pp > 1) r.loss = sum_over(ParallelRole::kPipeline, r.loss);
    // (Context-parallel ranks, also in the data group, hold the same loss: the mean counts
    // each of them.)
    if (parallel_ != nullptr && group(ParallelRole::kData).size() > 1)
      r.loss = sum_over(ParallelRole::kData, r.loss) /
               static_cast<double>(group(ParallelRole::kData).size());
    // Global gradient norm (over every parameter, each counted once), unscaled.
    // Context-parallel ranks hold shares of each sequence's gradient that the data-parallel
    // reduction averaged over cp x dp ranks instead of adding over cp (ScheduleExecutor::
    // loss_of): unscaling multiplies them back by cp.
    const double cp = static_cast<double>(config_.parallel.cp);
    // A graphed update computes the norm on the device, with the update (below).
    r.grad_norm = graph_update ? std::nan("") : optim_->grad_norm(scaler_.scale() / cp);
  };
  run_passes(0);
  // Result validation. The loss is global, and so is the gradient norm with the
  // distributed optimizer; without it each rank computes the norm of its own copy of the
  // reduced gradients, which a fault after the reduction spoils on that rank alone. So
  // the ranks agree: one rank's rejection makes every rank run the step again (as
  // Megatron's rerun state machine reduces its decision over the world).
  r.rerun_reason = validator_.reject(r.loss, r.grad_norm);
  const bool world =
      validator_.enabled() && parallel_ != nullptr && parallel_->grid().world_size() > 1;
  if (world && sum_over(ParallelRole::kWorld, r.rerun_reason.empty() ? 0.0 : 1.0) > 0)
    r.rerun_reason = ResultValidator::combine(
        all_gather_text(group(ParallelRole::kWorld), r.rerun_reason, "agreeing on a rerun"));
  if (!r.rerun_reason.empty()) {
    r.first_loss = r.loss;
    r.first_grad_norm = r.grad_norm;
    run_passes(1);
    bool same = ResultValidator::reproduced(r.first_loss, r.loss) &&
                ResultValidator::reproduced(r.first_grad_norm, r.grad_norm);
    r.rerun_reproduced = world ? sum_over(ParallelRole::kWorld, same ? 0.0 : 1.0) == 0 : same;
  }
  const double cp = static_cast<double>(config_.parallel.cp);
  r.lr = schedule_ != nullptr ? schedule_->lr(r.step) : components_.base_lr;
  bool finite = true;
  if (graph_update) {
    // The norm, the clipping and the update on the device, as the direct branch below
    // computes them: the same values to the bit.
    GraphedUpdate::Result u = graphed_update_->run(
        OptimizerStep{
            sizeof(OptimizerStep), r.step, r.lr, components_.weight_decay, cp / r.loss_scale, {}},
        scaler_.scale() / cp, std::isfinite(r.loss));
    r.grad_norm = u.grad_norm;
    finite = !u.skipped;
  } else {
    finite = std::isfinite(r.grad_norm) && std::isfinite(r.loss);
  }
  scaler_.update(!finite);
  if (!finite) {
    r.skipped = true;
    ++nonfinite_in_a_row_;
    int64_t limit = config_.train.max_nonfinite_steps;
    if (!scaler_.dynamic() && nonfinite_in_a_row_ >= limit)
      throw Error(Code::kAborted,
                  fmt::format("step {}: the loss or gradients were non-finite {} steps in a row "
                              "(limit /train/max_nonfinite_steps = {}); lower the learning rate "
                              "or check the data",
                              r.step, nonfinite_in_a_row_, limit));
  } else {
    nonfinite_in_a_row_ = 0;
    if (!graph_update) {
      double grad_scale = cp / r.loss_scale;
      if (config_.train.grad_clip > 0) {
        double coeff = config_.train.grad_clip / (r.grad_norm + 1e-6);
        if (coeff < 1) grad_scale *= coeff;
      }
      optim_->update(OptimizerStep{
          sizeof(OptimizerStep), r.step, r.lr, components_.weight_decay, grad_scale, {}});
    }
  }
  // FP8 scales for the next step from this step's amaxes, alike on every replica (reduced
  // over the ranks that quantise the same tensors: Megatron's amax reduction group).
  if (fp8_ != nullptr) {
    ICommunicator& amax = group(ParallelRole::kAmax);
    throw_if_error(fp8_->step_end(amax.size() > 1 ? &amax : nullptr, nullptr),
                   fmt::format("the FP8 recipe ('{}') at the end of step {}",
                               config_.precision.fp8.value("impl", "?"), r.step));
    if (test_fault_set() && fp8_->state_count() > 1)
      inject_fault_into_fp8_scale(parallel_ != nullptr ? parallel_->grid().rank() : 0, r.step,
                                  plugins_.host(), device_, fp8_state(1).second);
  }
  end_step_of_modules(r);
  metrics_->end_step();
  // Kernels on a device run asynchronously: the step ends when its work has.
  throw_if_error(plugins_.host().synchronize(device_), "the step's device work");
  ++iteration_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (parallel_ != nullptr) r.comm_seconds = parallel_->stats().blocked_seconds() - comm_before;
  return r;
}

void Trainer::record_timeline(const std::vector<TimedAction>& timeline, int64_t step) {
  // The share of the plan's span this rank spent outside passes (waiting for its
  // neighbours, sending and receiving): the measured bubble, averaged over ranks in the log.
  double busy = 0, first = 0, last = 0;
  for (size_t i = 0; i < timeline.size(); ++i) {
    const TimedAction& t = timeline[i];
    first = i == 0 ? t.start : std::min(first, t.start);
    last = std::max(last, t.end);
    if (is_pipeline_pass(t.action.op)) busy += t.end - t.start;
  }
  float bubble = last > first ? static_cast<float>(1.0 - busy / (last - first)) : 0.0f;
  metrics_->record("pipeline_bubble", make_view(&bubble, DType::kF32, {}), MetricReduce::kMean);
  if (step >= 2 && step < 2 + config_.log.trace_steps)
    for (TimedAction t : timeline) {
      t.rank = parallel_ != nullptr ? parallel_->grid().rank() : 0;
      trace_.push_back(t);
    }
}

void Trainer::write_trace(const std::filesystem::path& run_dir) {
  // Every rank's actions as Chrome trace events (one process per rank, one thread per
  // virtual chunk, microseconds since the trainer started), written by rank 0.
  nlohmann::json events = nlohmann::json::array();
  const int rank = parallel_ != nullptr ? parallel_->grid().rank() : 0;
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"name", fmt::format("rank {} (stage {})", rank, pp_rank_)}}}});
  for (const TimedAction& t : trace_) {
    const PipelineAction& a = t.action;
    events.push_back({{"name", fmt::format("{} {}", pipeline_op_name(a.op), a.micro_batch)},
                      {"cat", pipeline_op_name(a.op)},
                      {"ph", "X"},
                      {"pid", t.rank},
                      {"tid", a.chunk},
                      {"ts", t.start * 1e6},
                      {"dur", (t.end - t.start) * 1e6},
                      {"args", {{"micro_batch", a.micro_batch}, {"chunk", a.chunk}}}});
  }
  std::vector<std::string> all = {events.dump()};
  if (parallel_ != nullptr)
    all = all_gather_text(group(ParallelRole::kWorld), events.dump(), "gathering the trace");
  if (rank != 0 || run_dir.empty()) return;
  nlohmann::json merged = nlohmann::json::array();
  for (const std::string& text : all)
    for (const nlohmann::json& e : nlohmann::json::parse(text)) merged.push_back(e);
  const std::filesystem::path path = run_dir / "pipeline_trace.json";
  write_file_atomic(path,
                    nlohmann::json{{"traceEvents", merged}, {"displayTimeUnit", "ms"}}.dump());
  log_info("trace", fmt::format("pipeline actions of steps 2 to {} in {} (open it in Perfetto or "
                                "chrome://tracing)",
                                1 + config_.log.trace_steps, path.string()));
}

void Trainer::end_step_of_modules(const StepResult& r) {
  StepEvent event{sizeof(StepEvent), r.step, r.skipped ? 1 : 0, r.lr};
  for (const auto& [path, module] : params_->modules()) {
    if (module->interface_info().minor < 1) continue;  // built against SDK 1.4: no hook
    throw_if_error(module->step_end(&event),
                   fmt::format("step_end of module '{}'", path.empty() ? "model" : path));
  }
}

double Trainer::evaluate() {
  // Data-parallel ranks share the validation batches out and add up their losses.
  int64_t steps = config_.train.eval_steps;
  Batch batch;
  double sum = 0, missing = 0;
  // With expert parallelism every forward pass is collective over the expert group (and
  // with experts split over more ranks than tp, over the expert-tensor group), which spans
  // data ranks: a rank without a batch of its own in the last round runs the last one again
  // and discards it.
  const int64_t rounds = (steps + data_replicas_ - 1) / data_replicas_;
  const int etp = config_.parallel.etp > 0 ? config_.parallel.etp : config_.parallel.tp;
  const bool experts_span_data = config_.parallel.ep > 1 || config_.parallel.tp % etp != 0;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t i = round * data_replicas_ + data_rank_;
    if (i >= steps && !experts_span_data) break;
    if (!data_->valid_batch(std::min(i, steps - 1), batch)) {
      missing = 1;
      break;
    }
    const double loss = forward_only(batch);
    if (i < steps) sum += loss;
  }
  if (data_replicas_ > 1) {
    // Context-parallel ranks (in the data group too) share each batch and its loss.
    const double cp = static_cast<double>(config_.parallel.cp);
    missing = sum_over(ParallelRole::kData, missing);
    sum = sum_over(ParallelRole::kData, sum) / cp;
  }
  // The losses live on the last pipeline stage.
  if (config_.parallel.pp > 1) sum = sum_over(ParallelRole::kPipeline, sum);
  if (missing > 0) return std::nan("");
  return sum / static_cast<double>(steps);
}

double Trainer::sum_over(ParallelRole role, double value) {
  ICommunicator& comm = group(role);
  if (comm.size() == 1) return value;
  TensorView v = make_view(&value, DType::kF64, {1});
  throw_if_error(comm.all_reduce(&v, ReduceOp::kSum, nullptr),
                 fmt::format("all-reduce over the {} group", parallel_role_name(role)));
  return value;
}

std::function<void(int32_t, const TensorView&)> Trainer::logits_into(std::vector<float>* out) {
  return [this, out](int32_t, const TensorView& l) {
    out->resize(static_cast<size_t>(numel(l)));
    load_floats(plugins_.host(), l, out->data());
    // (B, T, Vp) -> (B, T, V): a padded vocabulary's padding columns dropped.
    if (l.ndim > 0) keep_columns(*out, l.shape[l.ndim - 1], vocab_size_);
  };
}

double Trainer::forward_backward(const Batch& batch, double loss_weight, std::vector<float>* logits,
                                 int32_t micro_batch) {
  StepPlanContext step;
  step.input = [&batch, micro_batch](int32_t) { return MicroBatchInput{&batch, micro_batch}; };
  step.loss_weight = loss_weight;
  step.seed = config_.train.seed;
  step.step = iteration_ + 1;
  step.recompute = config_.train.recompute;
  step.module_ids = &params_->module_ids();
  if (logits != nullptr && return_logits_) step.logits = logits_into(logits);
  return executor_->run(no_pipelining_plan(1), 1, step, "no_pipelining").sum_of_means;
}

double Trainer::forward_only(const Batch& batch, std::vector<float>* logits) {
  StepPlanContext step;
  step.seed = config_.train.seed;
  step.step = iteration_ + 1;
  step.module_ids = &params_->module_ids();
  if (logits != nullptr && return_logits_) step.logits = logits_into(logits);
  if (parallel_ != nullptr) {
    step.pipeline = &group(ParallelRole::kPipeline);
    step.context = &group(ParallelRole::kContext);
  }
  // With pipeline parallelism the loss comes out of the last stage only.
  return executor_->forward_only(batch, step).value_or(0.0);
}

RunResult Trainer::run(const RunOptions& options) {
  const TrainConfig& train = config_.train;
  int64_t steps = options.steps >= 0 ? options.steps : train.steps;
  Progress progress(options.run_dir, steps, iteration_);
  RunResult result;
  int64_t last_saved = -1;
  // Called at the same iterations on every rank, also on those that write nothing (plain
  // data parallelism: rank 0 writes the replicated state).
  auto save = [&](bool blocking) {
    if (last_saved == iteration_) return;
    last_saved = iteration_;
    // A device backend's collective that failed on the GPU after its call returned (NCCL)
    // may have left the state half reduced: such a failure comes out here, on every rank,
    // before anything is written, and the checkpoints already on disk stay the newest.
    if (parallel_ != nullptr) {
      try {
        parallel_->barrier_all();
      } catch (const Error& e) {
        throw Error(e.code(),
                    fmt::format("checkpoint of step {} not written: {}", iteration_, e.what()));
      }
    }
    check_fp8_state_agrees();  // on every rank: rank 0 writes the state for all
    if (options.checkpoint == nullptr) return;
    progress.clear_bar();
    std::fflush(stdout);
    options.checkpoint->save(iteration_, checkpoint_tensors(), checkpoint_metadata());
    if (blocking) options.checkpoint->wait();
  };
  ICommunicator* world = parallel_ != nullptr ? &group(ParallelRole::kWorld) : nullptr;
  double compute_seconds = 0;  // this rank's, since the last log line
  int64_t steps_since_log = 0;
  while (iteration_ < steps) {
    StepResult r = step();
    progress.add(r);
    compute_seconds += r.seconds - r.comm_seconds;
    ++steps_since_log;
    if (iteration_ % train.log_interval == 0 || iteration_ == steps) {
      LogFigures figures;
      if (world != nullptr && world->size() > 1) {
        std::vector<std::string> all =
            all_gather_text(*world, fmt::format("{:.9g}", compute_seconds / steps_since_log),
                            "gathering the ranks' step times");
        for (const std::string& text : all) figures.rank_compute_seconds.push_back(std::stod(text));
        figures.straggler_factor = config_.log.straggler_factor;
      }
      compute_seconds = 0;
      steps_since_log = 0;
      figures.flops_per_step = flops_per_step_;
      figures.peak_flops = peak_flops_;
      figures.peak_memory = peak_memory();
      figures.max_rss = max_rss_bytes();
      if (scaler_.dynamic()) figures.loss_scale = scaler_.scale();
      figures.metrics = metrics_->take(world);
      progress.log(iteration_, figures);
    }
    if (options.evaluate && (iteration_ % train.eval_interval == 0 || iteration_ == steps))
      progress.validation(iteration_, evaluate());
    progress.bar(iteration_);
    std::fflush(stdout);
    // Every rank stops after the same step: a signal seen by any rank stops them all.
    int signal = options.stop_signal != nullptr ? options.stop_signal->load() : 0;
    if (parallel_ != nullptr && options.stop_signal != nullptr &&
        sum_over(ParallelRole::kWorld, signal != 0 ? 1 : 0) > 0 && signal == 0)
      signal = SIGTERM;  // another rank was signalled
    if (signal != 0) {
      result.stop_signal = signal;
      save(true);
      break;
    }
    if (options.save_interval > 0 && iteration_ % options.save_interval == 0 && iteration_ < steps)
      save(false);
  }
  if (result.stop_signal == 0 && options.save_at_end) save(true);
  if (config_.parallel.pp > 1 && config_.log.trace_steps > 0 && !trace_.empty())
    write_trace(options.run_dir);
  if (options.checkpoint != nullptr) {
    options.checkpoint->wait();
    result.checkpoint = options.checkpoint->last_saved();
  }
  progress.clear_bar();
  std::fflush(stdout);
  result.iteration = iteration_;
  return result;
}

}  // namespace loom::core
