#include "core/train/trainer.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/data/corpus.h"
#include "core/data/gpt_data.h"
#include "core/data/mock_data.h"
#include "core/data/token_file.h"
#include "core/data/tokenizer.h"
#include "core/dist/rank_env.h"
#include "core/runtime/forward_context.h"
#include "core/spec/schema.h"
#include "core/train/flops.h"
#include "core/util/errors.h"
#include "core/util/log.h"
#include "loom/cpp/object.h"
#include "loom/kinds.h"

namespace loom::core {

namespace {

DType parse_dtype(const std::string& name) {
  DType dtype = dtype_from_name(name.c_str());
  if (dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) return dtype;
  throw SpecError("/precision/params", fmt::format("unknown dtype '{}'", name));
}

std::unique_ptr<DataSource> make_data(const nlohmann::json& spec,
                                      std::optional<std::filesystem::path>* tokenizer_out) {
  const nlohmann::json& data = spec["data"];
  const nlohmann::json& train = spec["train"];
  int64_t b = train["micro_batch_size"].get<int64_t>();
  int64_t t = train["seq_length"].get<int64_t>();
  uint64_t seed = train["seed"].get<uint64_t>();
  int64_t vocab = 0;
  if (spec["model"].is_object() && spec["model"].contains("vocab_size"))
    vocab = spec["model"]["vocab_size"].get<int64_t>();
  if (data.contains("vocab_size")) vocab = data["vocab_size"].get<int64_t>();
  if (vocab <= 0)
    throw SpecError("/data/vocab_size",
                    "unknown vocabulary size: set it here or as /model/vocab_size");
  if (data.value("mock", false)) return std::make_unique<MockData>(vocab, b, t, seed);
  if (data.contains("token_file")) {
    std::filesystem::path path = data["token_file"].get<std::string>();
    return std::make_unique<TokenFile>(path, data.value("token_dtype", "u16"), vocab, b, t,
                                       data["split"].get<std::string>(), seed);
  }
  if (data.contains("paths") || data.contains("corpus")) {
    GptDataOptions o;
    o.spec_pointer = "/data";
    std::optional<std::filesystem::path> tokenizer_path;
    if (data.contains("tokenizer")) tokenizer_path = data["tokenizer"]["path"].get<std::string>();
    if (data.contains("corpus")) {
      if (data.contains("paths"))
        throw SpecError("/data/corpus", "set either /data/corpus or /data/paths, not both");
      PreparedCorpus corpus = prepare_corpus(data["corpus"], "/data/corpus", tokenizer_path);
      if (corpus.reused)
        log_info("data", fmt::format("corpus: {} (cached; delete it to rebuild)",
                                     corpus.prefix.parent_path().string()));
      o.prefixes.push_back(corpus.prefix);
      tokenizer_path = corpus.tokenizer;
    } else {
      parse_data_paths(data["paths"], "/data/paths", o.prefixes, o.weights);
    }
    if (tokenizer_path) {
      std::unique_ptr<Tokenizer> tokenizer = Tokenizer::load(*tokenizer_path);
      if (tokenizer->vocab_size() > vocab)
        throw SpecError("/model/vocab_size",
                        fmt::format("{} is smaller than the tokenizer's {} ids ({}); raise it "
                                    "to at least {}",
                                    vocab, tokenizer->vocab_size(), tokenizer_path->string(),
                                    tokenizer->vocab_size()));
      o.eod = tokenizer->eod();
      *tokenizer_out = *tokenizer_path;
    }
    if (data.contains("eod_id")) o.eod = data["eod_id"].get<int32_t>();
    o.split = data["split"].get<std::string>();
    o.batch = b;
    o.seq_length = t;
    o.seed = static_cast<uint32_t>(seed);
    int64_t global =
        train.contains("global_batch_size") ? train["global_batch_size"].get<int64_t>() : b;
    o.train_samples = train["steps"].get<int64_t>() * global;
    o.valid_samples = train["eval_steps"].get<int64_t>() * b;
    if (data.contains("cache_dir")) o.cache_dir = data["cache_dir"].get<std::string>();
    o.vocab_size = vocab;
    o.eod_mask_loss = data["eod_mask_loss"].get<bool>();
    o.reset_position_ids = data["reset_position_ids"].get<bool>();
    o.reset_attention_mask = data["reset_attention_mask"].get<bool>();
    return std::make_unique<GptData>(o);
  }
  throw SpecError("/data",
                  "no training data: set /data/paths (indexed datasets from `loom preprocess`), "
                  "/data/corpus (raw text loom prepares), /data/token_file (a flat file of "
                  "token ids) or /data/mock = true (synthetic tokens)");
}

// Test hook for fault tests: LOOM_TEST_FAULT="kill:RANK:STEP" SIGKILLs rank RANK, and
// "hang:RANK:STEP" stops it for ever, in the middle of step STEP (after its first
// micro-batch's backward, before the gradient reduction).
void maybe_inject_fault(int rank, int64_t step) {
  static const struct Hook {
    std::string what;
    int rank = -1;
    int64_t step = -1;
  } hook = [] {
    Hook h;
    const char* env = std::getenv("LOOM_TEST_FAULT");
    if (env == nullptr) return h;
    std::string text(env);
    size_t a = text.find(':'), b = text.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) return h;
    h.what = text.substr(0, a);
    h.rank = std::atoi(text.substr(a + 1, b - a - 1).c_str());
    h.step = std::atoll(text.substr(b + 1).c_str());
    return h;
  }();
  if (hook.rank != rank || hook.step != step) return;
  std::fprintf(stderr, "LOOM_TEST_FAULT: %s rank %d at step %lld\n", hook.what.c_str(), rank,
               static_cast<long long>(step));
  std::fflush(stderr);
  if (hook.what == "kill") raise(SIGKILL);
  if (hook.what == "hang")
    for (;;) pause();
}

uint64_t max_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace

Trainer::Trainer(const nlohmann::json& spec, PluginManager& plugins,
                 std::unique_ptr<DataSource> data, const nlohmann::json& model_inherited,
                 ParallelState* parallel)
    : spec_(spec), plugins_(plugins), parallel_(parallel) {
  const nlohmann::json& train = spec_["train"];
  const nlohmann::json& precision = spec_["precision"];
  std::string device = train["device"].get<std::string>();
  // One GPU per rank on a machine: local rank r trains on device r.
  device_ = device == "cuda" ? Device{DeviceType::kCuda,
                                      parallel_ != nullptr ? dist::detect_rank_env().local_rank : 0}
                             : kCpu;
  params_dtype_ = parse_dtype(precision["params"].get<std::string>());
  micro_batch_ = train["micro_batch_size"].get<int64_t>();
  seq_length_ = train["seq_length"].get<int64_t>();
  int64_t global = train.contains("global_batch_size") ? train["global_batch_size"].get<int64_t>()
                                                       : micro_batch_;
  int64_t dp = spec_["parallel"]["dp"].get<int64_t>();
  if (parallel_ != nullptr) {
    dp_size_ = parallel_->grid().size("dp");
    dp_rank_ = parallel_->grid().coord("dp");
    tp_rank_ = parallel_->grid().coord("tp");
    if (dp_size_ != dp)
      throw SpecError("/parallel/dp",
                      fmt::format("{} differs from the process grid's dp {}", dp, dp_size_));
  } else if (dp != 1) {
    throw SpecError("/parallel/dp",
                    fmt::format("{} needs {} processes; start them with `loom train --nproc N` or "
                                "`loom launch`",
                                dp, dp));
  }
  if (global % (micro_batch_ * dp) != 0)
    throw SpecError("/train/global_batch_size",
                    fmt::format("{} is not a multiple of micro_batch_size x dp = {} x {}", global,
                                micro_batch_, dp));
  micro_batches_ = global / (micro_batch_ * dp);
  grad_clip_ = train["grad_clip"].get<double>();

  // Kernels: the device's library plus any the spec names; pins first.
  std::vector<std::string> libraries;
  if (spec_["kernels"].contains("libraries"))
    for (const auto& l : spec_["kernels"]["libraries"]) libraries.push_back(l.get<std::string>());
  if (libraries.empty()) libraries.push_back("kernels_" + device);
  for (const std::string& lib : libraries) {
    if (plugins_.catalog().find(lib) == nullptr)
      throw PluginError(Code::kNotFound,
                        fmt::format("kernel library '{}' not found (spec /kernels/libraries, or "
                                    "the default for device '{}'); searched: {}",
                                    lib, device, describe_roots(plugins_.catalog().roots())));
    plugins_.load(lib);
  }
  // A device other than the CPU needs a runtime that sees one: said before anything is built.
  try {
    plugins_.host().check_device(device_);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("spec /train/device '{}': {}", device, e.what()));
  }
  std::map<std::string, std::string> pins;
  for (const auto& [op, kernel] : spec_["kernels"]["pin"].items())
    pins[op] = kernel.get<std::string>();
  plugins_.host().set_pins(std::move(pins));

  // Data before the model: its errors (missing files, a tokenizer larger than the model)
  // come before anything is built or allocated.
  data_ = data ? std::move(data) : make_data(spec_, &tokenizer_path_);
  data_description_ = data_->describe();

  // The model, with the run's shape handed down (Megatron's config).
  nlohmann::json inherited = {{"seq_length", seq_length_},
                              {"micro_batch_size", micro_batch_},
                              {"params_dtype", precision["params"]},
                              {"device", device},
                              {"sequence_parallel", spec_["parallel"]["sequence_parallel"]}};
  for (const auto& [k, v] : model_inherited.items()) inherited[k] = v;
  return_logits_ = inherited.value("return_logits", false);
  // FP8 training (Transformer Engine's recipes): the recipe is handed to every module built.
  if (precision.contains("fp8")) {
    fp8_object_ = build_component(plugins_, precision["fp8"], kinds::kFp8Recipe, "/precision/fp8",
                                  {{"device", device}});
    fp8_ = interface_cast<IFp8Recipe>(fp8_object_.get());
  }
  model_object_ =
      build_component(plugins_, spec_["model"], kinds::kModel, "/model", inherited, fp8_);
  model_ = interface_cast<IModel>(model_object_.get());
  const nlohmann::json& par = spec_["parallel"];
  bool sharded = par["distributed_optimizer"].get<bool>();
  BucketOptions buckets{par["bucket_size"].get<int64_t>(), dp_size_};
  params_ = std::make_unique<ParameterSet>(plugins_.host(), *model_, device_, buckets);
  params_->initialize(train["seed"].get<uint64_t>(), static_cast<int>(tp_rank_));

  // Optimizer and LR schedule. The schedule inherits the optimizer's peak LR and the run
  // length.
  if (!spec_.contains("optimizer"))
    throw SpecError("/optimizer",
                    "missing: training needs an optimizer, e.g. {\"impl\": \"adamw\"}");
  optimizer_object_ = build_component(plugins_, spec_["optimizer"], kinds::kOptimizer, "/optimizer",
                                      {{"device", device}});
  optimizer_ = interface_cast<IOptimizer>(optimizer_object_.get());
  weight_decay_ = spec_["optimizer"].value("weight_decay", 0.0);
  constant_lr_ = spec_["optimizer"].value("lr", 0.0);
  if (spec_.contains("lr_schedule")) {
    nlohmann::json sched_inherited = {{"train_steps", train["steps"]}};
    if (spec_["optimizer"].contains("lr")) sched_inherited["lr"] = spec_["optimizer"]["lr"];
    schedule_object_ = build_component(plugins_, spec_["lr_schedule"], kinds::kLrSchedule,
                                       "/lr_schedule", sched_inherited);
    schedule_ = interface_cast<ILrSchedule>(schedule_object_.get());
  }

  // Master weights and optimizer states. The destructor does not run when the constructor
  // throws: whatever was allocated is freed here then.
  IHost& host = plugins_.host();
  try {
    ICommunicator* dp_comm = nullptr;
    throw_if_error(host.communicator(make_string_view("dp"), &dp_comm), "the dp group");
    grad_sync_ = std::make_unique<GradSync>(*params_, *dp_comm, sharded, host);
    readiness_ = std::make_unique<BucketReadiness>(*params_);
    // On a device the kernels that wrote a bucket's gradients may still be queued when it
    // is handed over: the device's communicator orders its collectives after the work
    // queued on the compute stream (comm_nccl), so the reduction reads them finished.
    overlap_ = par["overlap_grad_reduce"].get<bool>() && parallel_ != nullptr;
    for (const Segment& seg : grad_sync_->segments()) {
      Parameter& p = params_->all()[seg.param];
      states_.push_back(std::make_unique<ParamState>());
      ParamState* st = states_.back().get();
      st->param = &p;
      st->segment = seg;
      st->decay = (p.info.flags & kParamNoWeightDecay) == 0;
      st->in_norm = p.info.tp_split_dim >= 0 || tp_rank_ == 0;
      int64_t n = seg.length;
      auto alloc_f32 = [&]() {
        void* mem = nullptr;
        throw_if_error(host.allocate(device_, static_cast<uint64_t>(n) * 4, 64, &mem));
        st->owned.push_back(mem);
        if (mem != nullptr)
          throw_if_error(host.fill_zero(device_, mem, static_cast<uint64_t>(n) * 4));
        return make_view(mem, DType::kF32, {n}, device_);
      };
      char* value = static_cast<char*>(p.value.data) +
                    seg.begin * static_cast<int64_t>(dtype_size(p.info.dtype));
      if (p.info.dtype == DType::kF32) {
        st->master = make_view(value, DType::kF32, {n}, device_);
      } else {
        st->master = alloc_f32();
        std::vector<float> staging(static_cast<size_t>(n));
        load_floats(host, make_view(value, p.info.dtype, {n}, device_), staging.data());
        copy_from_host(host, staging.data(), st->master);
      }
      for (int32_t s = 0; s < optimizer_->state_count(); ++s) st->states.push_back(alloc_f32());
    }
    sumsq_ = Kernel(host, ops::kSumSq, device_, DType::kF32);
    if (device_.type != DeviceType::kCpu) throw_if_error(host.allocate(device_, 8, 64, &norm_acc_));
    if (params_dtype_ != DType::kF32) cast_ = Kernel(host, ops::kCast, device_, DType::kF32);

    dynamic_scaling_ = params_dtype_ == DType::kF16;
    if (dynamic_scaling_) {
      loss_scale_ = precision["initial_loss_scale"].get<double>();
      min_loss_scale_ = precision["min_loss_scale"].get<double>();
      scale_window_ = precision["loss_scale_window"].get<int64_t>();
      hysteresis_ = hysteresis_left_ = precision["hysteresis"].get<int64_t>();
    }

    flops_per_step_ = model_flops_per_token(model_numel(), spec_["model"], seq_length_) *
                      static_cast<double>(micro_batch_ * seq_length_ * micro_batches_ * dp);
    if (device_.type == DeviceType::kCpu) {
      peak_flops_ = measure_gemm_peak(host);
    } else {
      // A GPU's MFU is stated against its dense bf16 peak (Megatron's and llm.c's habit).
      DeviceProperties props{};
      throw_if_error(plugins_.host().runtime(device_).properties(device_.index, &props));
      peak_flops_ = props.peak_bf16_flops;
      device_name_ = props.name;
    }
    // MFU of a multi-process run is against the peak of every rank together.
    if (parallel_ != nullptr) peak_flops_ *= parallel_->grid().world_size();
  } catch (...) {
    release_states();
    throw;
  }
}

Trainer::~Trainer() { release_states(); }

int64_t Trainer::model_numel() const {
  int64_t n = 0;
  for (const Parameter& p : params_->all()) {
    int64_t whole = 1;
    for (int32_t d = 0; d < p.info.ndim; ++d) whole *= p.info.global_shape[d];
    n += whole;
  }
  return n;
}

uint64_t Trainer::peak_memory() const {
  if (device_.type == DeviceType::kCpu) return plugins_.host().cpu_memory().peak;
  return plugins_.host().device_memory(device_).peak_allocated;
}

void Trainer::reset_memory_peak() { plugins_.host().reset_peak(device_); }

RecomputePolicy Trainer::recompute_policy() const {
  const std::string recompute = spec_["train"]["recompute"].get<std::string>();
  if (recompute == "full") return RecomputePolicy::kFull;
  if (recompute == "selective") return RecomputePolicy::kSelective;
  return RecomputePolicy::kNone;
}

MemoryEstimate Trainer::memory_estimate() const {
  MemoryEstimate e;
  for (const Parameter& p : params_->all()) {
    int64_t n = 1;
    for (int32_t d = 0; d < p.info.ndim; ++d) n *= p.info.shape[d];
    e.weights += static_cast<uint64_t>(n) * dtype_size(p.info.dtype);
  }
  e.grads = static_cast<uint64_t>(params_->flat_size()) * sizeof(float);
  for (const auto& st : states_) {
    uint64_t n = static_cast<uint64_t>(st->segment.length);
    if (params_dtype_ != DType::kF32) e.master += n * sizeof(float);
    e.optimizer += st->states.size() * n * sizeof(float);
  }
  // The FP8 recipe's state as it allocates it (asking for it allocates it, as the first
  // quantisation would).
  if (fp8_ != nullptr)
    for (int32_t i = 0; i < fp8_->state_count(); ++i) e.fp8 += nbytes(fp8_state(i).second);
  ActivationShape shape;
  shape.micro_batch = micro_batch_;
  shape.seq_length = seq_length_;
  shape.tp = spec_["parallel"]["tp"].get<int64_t>();
  shape.sequence_parallel = spec_["parallel"]["sequence_parallel"].get<bool>();
  shape.dtype = params_dtype_;
  shape.recompute = recompute_policy();
  shape.fp8 = fp8_ != nullptr;
  e.activations = transformer_activation_bytes(spec_["model"], shape);
  return e;
}

void Trainer::release_states() {
  for (auto& st : states_)
    for (void* p : st->owned) plugins_.host().deallocate(device_, p);
  states_.clear();
  plugins_.host().deallocate(device_, norm_acc_);
  norm_acc_ = nullptr;
}

void Trainer::print_banner(std::FILE* out) const {
  const nlohmann::json& train = spec_["train"];
  int64_t tensors = static_cast<int64_t>(params_->all().size());
  std::string local =
      model_numel() != params_->numel() ? fmt::format(", {} on this rank", params_->numel()) : "";
  std::fprintf(out, "  model: %s, %lld parameters in %lld tensors (%s%s)\n",
               spec_["model"]["impl"].get<std::string>().c_str(),
               static_cast<long long>(model_numel()), static_cast<long long>(tensors),
               dtype_name(params_dtype_), local.c_str());
  std::fprintf(out, "  batch: %lld micro-batches of %lld x %lld tokens per step; %lld steps\n",
               static_cast<long long>(micro_batches_), static_cast<long long>(micro_batch_),
               static_cast<long long>(seq_length_),
               static_cast<long long>(train["steps"].get<int64_t>()));
  std::fprintf(out, "  data: %s\n", data_description_.c_str());
  if (device_.type == DeviceType::kCpu)
    std::fprintf(
        out, "  model FLOPs per step: %.3g (6N + 6LTC per token); fp32 GEMM peak %.1f GFLOP/s\n",
        flops_per_step_, peak_flops_ / 1e9);
  else
    std::fprintf(out,
                 "  model FLOPs per step: %.3g (6N + 6LTC per token); device %s, dense bf16 peak "
                 "%.1f TFLOP/s%s\n",
                 flops_per_step_, device_name_.c_str(), peak_flops_ / 1e12,
                 peak_flops_ > 0 ? "" : " (unknown: no MFU)");
  if (fp8_ != nullptr) std::fprintf(out, "  fp8: %s\n", spec_["precision"]["fp8"].dump().c_str());
  std::fprintf(out, "  memory estimate: %s\n", memory_estimate().describe().c_str());
  std::string kernels;
  for (const auto& r : plugins_.host().resolutions())
    kernels +=
        fmt::format("{}{}:{}={}", kernels.empty() ? "" : ", ", r.op, dtype_name(r.dtype), r.kernel);
  std::fprintf(out, "  kernels: %s\n", kernels.c_str());
  std::fflush(out);
}

double Trainer::lr_at(int64_t step) const {
  return schedule_ != nullptr ? schedule_->lr(step) : constant_lr_;
}

namespace {

// Views of a host batch for the model's inputs (CPU: no copy).
struct BatchViews {
  TensorView tokens, labels, mask, positions, segments;
};

// On another device, each present input is copied into memory of the forward context.
TensorView to_device(IHost& host, IForwardContext& ctx, const TensorView& v, Device device) {
  if (device.type == DeviceType::kCpu || v.data == nullptr) return v;
  TensorView d = allocate(ctx, v.dtype, {v.shape[0], v.shape[1]}, device);
  copy_from_host(host, v.data, d);
  return d;
}

BatchViews batch_views(const Batch& batch, Device device, IHost& host, IForwardContext& ctx) {
  BatchViews v;
  auto* tokens = const_cast<int32_t*>(batch.tokens.data());
  auto* labels = const_cast<int32_t*>(batch.labels.data());
  auto* mask = const_cast<float*>(batch.loss_mask.data());
  v.tokens = make_view(tokens, DType::kI32, {batch.batch, batch.seq_length});
  v.labels = make_view(labels, DType::kI32, {batch.batch, batch.seq_length});
  v.mask = make_view(mask, DType::kF32, {batch.batch, batch.seq_length});
  v.positions = empty_view();
  if (!batch.position_ids.empty())
    v.positions = make_view(const_cast<int32_t*>(batch.position_ids.data()), DType::kI32,
                            {batch.batch, batch.seq_length});
  v.segments = empty_view();
  if (!batch.segment_ids.empty())
    v.segments = make_view(const_cast<int32_t*>(batch.segment_ids.data()), DType::kI32,
                           {batch.batch, batch.seq_length});
  for (TensorView* t : {&v.tokens, &v.labels, &v.mask, &v.positions, &v.segments})
    *t = to_device(host, ctx, *t, device);
  return v;
}

double read_scalar(IHost& host, const TensorView& v) {
  float x = 0;
  throw_if_error(host.copy(kCpu, &x, v.device, v.data, 4), "reading the loss");
  return x;
}

}  // namespace

// Runs the model's forward on `batch` in `ctx`: returns the loss and, when asked and
// available, copies the logits out.
double Trainer::run_forward(ForwardContext& ctx, const Batch& batch, std::vector<float>* logits) {
  BatchViews v = batch_views(batch, device_, plugins_.host(), ctx);
  TensorView inputs[5] = {v.tokens, v.labels, v.mask, v.positions, v.segments};
  TensorView outputs[2] = {};
  throw_if_error(model_->forward(&ctx, inputs, 5, outputs, return_logits_ ? 2 : 1),
                 "model forward");
  if (logits != nullptr && return_logits_ && outputs[1].data != nullptr) {
    logits->resize(static_cast<size_t>(numel(outputs[1])));
    load_floats(plugins_.host(), outputs[1], logits->data());
  }
  return read_scalar(plugins_.host(), outputs[0]);
}

double Trainer::forward_backward(const Batch& batch, double loss_weight, std::vector<float>* logits,
                                 int32_t micro_batch, bool last) {
  ForwardContext ctx(plugins_.host(), true, recompute_policy(), micro_batch,
                     spec_["train"]["seed"].get<uint64_t>(), iteration_ + 1,
                     &params_->module_ids());
  double loss = run_forward(ctx, batch, logits);
  float dloss = static_cast<float>(loss_weight);
  TensorView grad_out = allocate(ctx, DType::kF32, {}, device_);
  copy_from_host(plugins_.host(), &dloss, grad_out);
  if (last && overlap_)
    ctx.set_grads_ready([this](const void* owner) {
      for (size_t b : readiness_->mark(owner)) reduce_bucket(b);
    });
  throw_if_error(model_->backward(&ctx, &grad_out, 1, nullptr, 0), "model backward");
  ctx.rethrow_grads_ready_error();
  return loss;
}

double Trainer::forward_only(const Batch& batch, std::vector<float>* logits) {
  ForwardContext ctx(plugins_.host(), false, RecomputePolicy::kNone, 0,
                     spec_["train"]["seed"].get<uint64_t>(), iteration_ + 1,
                     &params_->module_ids());
  return run_forward(ctx, batch, logits);
}

void Trainer::update_loss_scale(bool overflow) {
  if (!dynamic_scaling_) return;
  if (overflow) {
    good_steps_ = 0;
    if (--hysteresis_left_ <= 0) {
      loss_scale_ = std::max(loss_scale_ * 0.5, min_loss_scale_);
      hysteresis_left_ = hysteresis_;
    }
  } else if (++good_steps_ >= scale_window_) {
    loss_scale_ *= 2;
    good_steps_ = 0;
    hysteresis_left_ = hysteresis_;
  }
}

StepResult Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  StepResult r;
  r.step = iteration_ + 1;
  r.loss_scale = loss_scale_;
  double comm_before = parallel_ != nullptr ? parallel_->stats().blocked_seconds() : 0;
  params_->zero_grads();
  readiness_->reset();
  Batch batch;
  double loss_sum = 0;
  // Data-parallel rank r reads micro-batch m of the step at samples (m * dp + r) * B of
  // the global batch, Megatron's order: one rank with dp times the micro-batches reads
  // the same samples, and draws the same dropout masks (micro-batch index m * dp + r).
  int64_t start = data_->position();
  for (int64_t m = 0; m < micro_batches_; ++m) {
    if (dp_size_ > 1) data_->seek(start + (m * dp_size_ + dp_rank_) * micro_batch_);
    data_->next_train(batch);
    loss_sum +=
        forward_backward(batch, loss_scale_ / static_cast<double>(micro_batches_), nullptr,
                         static_cast<int32_t>(m * dp_size_ + dp_rank_), m + 1 == micro_batches_);
    if (parallel_ != nullptr && m == 0) maybe_inject_fault(parallel_->grid().rank(), r.step);
    r.tokens += batch.batch * batch.seq_length * dp_size_;
  }
  if (dp_size_ > 1) data_->seek(start + micro_batches_ * dp_size_ * micro_batch_);
  r.loss = loss_sum / static_cast<double>(micro_batches_);
  if (overlap_ && log_level() == LogLevel::kDebug)
    log_debug("parallel", fmt::format("step {}: {} of {} gradient buckets handed to the "
                                      "reduction during backward",
                                      r.step, readiness_->released(), readiness_->bucket_count()));
  // The buckets not handed over during backward, in order (BucketReadiness keeps the order
  // the same on every rank).
  for (size_t b : readiness_->release_rest()) reduce_sequence_parallel_grads(b);
  grad_sync_->finish();
  if (dp_size_ > 1) r.loss = sum_over("dp", r.loss) / static_cast<double>(dp_size_);

  // Global gradient norm (over every parameter, each counted once), unscaled.
  // sumsq accumulates in f64 where the gradients live; one read back per step.
  double sumsq = 0;
  IHost& host = plugins_.host();
  TensorView acc = make_view(norm_acc_ != nullptr ? norm_acc_ : &sumsq, DType::kF64, {1}, device_);
  throw_if_error(host.fill_zero(device_, acc.data, 8));
  for (auto& st : states_) {
    if ((st->param->info.flags & kParamFrozen) || !st->in_norm) continue;
    sumsq_({grad_sync_->grad_of(st->segment)}, {acc});
  }
  if (acc.data != &sumsq) copy_to_host(host, acc, &sumsq);
  sumsq = sum_over(grad_sync_->sharded() ? "tp,dp" : "tp", sumsq);
  r.grad_norm = std::sqrt(sumsq) / loss_scale_;
  bool finite = std::isfinite(r.grad_norm) && std::isfinite(r.loss);
  update_loss_scale(!finite);
  r.lr = lr_at(r.step);
  if (!finite) {
    r.skipped = true;
    ++nonfinite_in_a_row_;
    int64_t limit = spec_["train"]["max_nonfinite_steps"].get<int64_t>();
    if (!dynamic_scaling_ && nonfinite_in_a_row_ >= limit)
      throw Error(Code::kAborted,
                  fmt::format("step {}: the loss or gradients were non-finite {} steps in a row "
                              "(limit /train/max_nonfinite_steps = {}); lower the learning rate "
                              "or check the data",
                              r.step, nonfinite_in_a_row_, limit));
  } else {
    nonfinite_in_a_row_ = 0;
    double grad_scale = 1.0 / loss_scale_;
    if (grad_clip_ > 0) {
      double coeff = grad_clip_ / (r.grad_norm + 1e-6);
      if (coeff < 1) grad_scale *= coeff;
    }
    OptimizerStep hp{sizeof(OptimizerStep), r.step, r.lr, weight_decay_, grad_scale};
    if (has_update_many(*optimizer_))
      update_all(hp);
    else
      update_each(hp);
    grad_sync_->gather_values();
  }
  // FP8 scales for the next step from this step's amaxes, alike on every replica (reduced
  // over the groups that quantise the same tensors: Megatron's amax reduction group).
  if (fp8_ != nullptr) {
    ICommunicator* amax_group = nullptr;
    throw_if_error(host.communicator(make_string_view("tp,dp"), &amax_group), "the tp,dp group");
    throw_if_error(fp8_->step_end(amax_group->size() > 1 ? amax_group : nullptr, nullptr),
                   fmt::format("the FP8 recipe ('{}') at the end of step {}",
                               spec_["precision"]["fp8"]["impl"].get<std::string>(), r.step));
  }
  // Kernels on a device run asynchronously: the step ends when its work has.
  throw_if_error(plugins_.host().synchronize(device_), "the step's device work");
  ++iteration_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (parallel_ != nullptr) r.comm_seconds = parallel_->stats().blocked_seconds() - comm_before;
  return r;
}

TensorView Trainer::param_shard(const ParamState& st) const {
  const Parameter& p = *st.param;
  char* value = static_cast<char*>(p.value.data) +
                st.segment.begin * static_cast<int64_t>(dtype_size(p.info.dtype));
  return make_view(value, p.info.dtype, {st.segment.length}, device_);
}

void Trainer::update_all(const OptimizerStep& hp) {
  // Every shard in one call, so a GPU optimizer can update them in a few multi-tensor
  // launches; a non-f32 parameter's view receives its new master there (an f32 one is its
  // own master).
  std::vector<OptimizerShard> shards;
  shards.reserve(states_.size());
  for (auto& st : states_) {
    const Parameter& p = *st->param;
    if (p.info.flags & kParamFrozen) continue;
    OptimizerShard s{};
    s.struct_size = sizeof(OptimizerShard);
    s.decay = st->decay ? 1 : 0;
    s.master = st->master;
    s.grad = grad_sync_->grad_of(st->segment);
    s.states = st->states.data();
    s.param = p.info.dtype != DType::kF32 ? param_shard(*st) : empty_view();
    shards.push_back(s);
  }
  throw_if_error(
      optimizer_->update_many(&hp, static_cast<int32_t>(shards.size()), shards.data(), nullptr),
      "optimizer update");
}

void Trainer::update_each(const OptimizerStep& hp) {
  // An optimizer built against optimizer 1.0: one update per shard, then the cast.
  for (auto& st : states_) {
    Parameter& p = *st->param;
    if (p.info.flags & kParamFrozen) continue;
    TensorView grad = grad_sync_->grad_of(st->segment);
    OptimizerStep h = hp;
    if (!st->decay) h.weight_decay = 0;
    throw_if_error(
        optimizer_->update(&h, st->decay, &st->master, &grad, st->states.data(), nullptr),
        fmt::format("optimizer update of {}", p.name));
    if (p.info.dtype != DType::kF32) cast_({st->master}, {param_shard(*st)});
  }
}

double Trainer::evaluate() {
  // Data-parallel ranks share the validation batches out and add up their losses.
  int64_t steps = spec_["train"]["eval_steps"].get<int64_t>();
  Batch batch;
  double sum = 0, missing = 0;
  for (int64_t i = dp_rank_; i < steps; i += dp_size_) {
    if (!data_->valid_batch(i, batch)) {
      missing = 1;
      break;
    }
    sum += forward_only(batch);
  }
  if (dp_size_ > 1) {
    missing = sum_over("dp", missing);
    sum = sum_over("dp", sum);
  }
  if (missing > 0) return std::nan("");
  return sum / static_cast<double>(steps);
}

double Trainer::sum_over(const char* dims, double value) {
  ICommunicator* comm = nullptr;
  throw_if_error(plugins_.host().communicator(make_string_view(dims), &comm),
                 fmt::format("the {} group", dims));
  if (comm->size() == 1) return value;
  TensorView v = make_view(&value, DType::kF64, {1});
  throw_if_error(comm->all_reduce(&v, ReduceOp::kSum, nullptr),
                 fmt::format("all-reduce over the {} group", dims));
  return value;
}

void Trainer::reduce_bucket(size_t b) {
  reduce_sequence_parallel_grads(b);
  grad_sync_->start(b);
}

void Trainer::reduce_sequence_parallel_grads(size_t b) {
  ICommunicator* tp = nullptr;
  throw_if_error(plugins_.host().communicator(make_string_view("tp"), &tp), "the tp group");
  if (tp->size() == 1) return;
  for (size_t i : params_->buckets()[b].params) {
    Parameter& p = params_->all()[i];
    if ((p.info.flags & kParamSequenceParallel) == 0) continue;
    TensorView g = make_view(p.grad.data, DType::kF32, {p.numel()}, device_);
    throw_if_error(tp->all_reduce(&g, ReduceOp::kSum, nullptr),
                   fmt::format("sequence-parallel gradient all-reduce of {}", p.name));
  }
}

RunResult Trainer::run(const RunOptions& options) {
  const nlohmann::json& train = spec_["train"];
  int64_t steps = options.steps >= 0 ? options.steps : train["steps"].get<int64_t>();
  int64_t log_interval = train["log_interval"].get<int64_t>();
  int64_t eval_interval = train["eval_interval"].get<int64_t>();
  std::ofstream metrics;
  if (!options.run_dir.empty()) {
    std::filesystem::create_directories(options.run_dir);
    metrics.open(options.run_dir / "metrics.jsonl", std::ios::app);
    if (!metrics)
      throw IoError(fmt::format("cannot write {}", (options.run_dir / "metrics.jsonl").string()));
  }
  bool tty = isatty(fileno(stdout)) != 0;
  double loss_acc = 0, time_acc = 0, norm_acc = 0;
  int64_t count = 0, tokens_acc = 0, skipped = 0, steps_acc = 0;
  auto clear_bar = [&] {
    if (tty) std::printf("\r\033[K");
  };
  auto t_start = std::chrono::steady_clock::now();
  int64_t first_iteration = iteration_;
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
    if (options.checkpoint == nullptr) return;
    clear_bar();
    std::fflush(stdout);
    options.checkpoint->save(iteration_, checkpoint_tensors(), checkpoint_metadata());
    if (blocking) options.checkpoint->wait();
  };
  while (iteration_ < steps) {
    StepResult r = step();
    if (r.skipped) {
      ++skipped;
      clear_bar();
      std::printf("step %lld skipped: non-finite %s (loss scale %g)\n",
                  static_cast<long long>(r.step), std::isfinite(r.loss) ? "gradients" : "loss",
                  r.loss_scale);
    } else {
      loss_acc += r.loss;
      norm_acc += r.grad_norm;
      ++count;
    }
    time_acc += r.seconds;
    tokens_acc += r.tokens;
    ++steps_acc;
    if (iteration_ % log_interval == 0 || iteration_ == steps) {
      int64_t steps_in = steps_acc;
      double step_ms = 1e3 * time_acc / static_cast<double>(steps_in);
      double tps = static_cast<double>(tokens_acc) / time_acc;
      double mfu = peak_flops_ > 0 ? flops_per_step_ * steps_in / time_acc / peak_flops_ : 0;
      double loss = count ? loss_acc / count : std::nan("");
      double norm = count ? norm_acc / count : std::nan("");
      uint64_t peak = peak_memory();
      clear_bar();
      std::printf(
          "iter %6lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.1f ms/step "
          "| MFU %.1f%% | mem %s (rss %s)%s\n",
          static_cast<long long>(iteration_), static_cast<long long>(steps), loss, r.lr, norm, tps,
          step_ms, 100 * mfu, human_bytes(static_cast<double>(peak)).c_str(),
          human_bytes(static_cast<double>(max_rss_bytes())).c_str(),
          dynamic_scaling_ ? fmt::format(" | scale {:g}", loss_scale_).c_str() : "");
      if (metrics.is_open()) {
        nlohmann::json line = {{"step", iteration_},
                               {"loss", loss},
                               {"lr", r.lr},
                               {"grad_norm", norm},
                               {"tokens_per_s", tps},
                               {"step_ms", step_ms},
                               {"mfu", mfu},
                               {"peak_mem_bytes", peak},
                               {"max_rss_bytes", max_rss_bytes()},
                               {"skipped", skipped},
                               {"loss_scale", loss_scale_}};
        if (!std::isfinite(loss)) line["loss"] = nullptr;
        if (!std::isfinite(norm)) line["grad_norm"] = nullptr;
        metrics << line.dump() << "\n" << std::flush;
      }
      loss_acc = time_acc = norm_acc = 0;
      count = tokens_acc = skipped = steps_acc = 0;
    }
    if (options.evaluate && (iteration_ % eval_interval == 0 || iteration_ == steps)) {
      double valid = evaluate();
      if (std::isfinite(valid)) {
        clear_bar();
        std::printf("validation at iter %lld | loss %.4f | ppl %.2f\n",
                    static_cast<long long>(iteration_), valid, std::exp(valid));
        if (metrics.is_open())
          metrics << nlohmann::json{{"step", iteration_}, {"valid_loss", valid}}.dump() << "\n"
                  << std::flush;
      }
    }
    if (tty && iteration_ < steps) {
      double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      double eta = elapsed / static_cast<double>(iteration_ - first_iteration) *
                   static_cast<double>(steps - iteration_);
      int width = 30, filled = static_cast<int>(width * iteration_ / steps);
      std::printf("\r[%s%s] %lld/%lld  eta %.0fs", std::string(filled, '#').c_str(),
                  std::string(width - filled, '.').c_str(), static_cast<long long>(iteration_),
                  static_cast<long long>(steps), eta);
    }
    std::fflush(stdout);
    // Every rank stops after the same step: a signal seen by any rank stops them all.
    int signal = options.stop_signal != nullptr ? options.stop_signal->load() : 0;
    if (parallel_ != nullptr && options.stop_signal != nullptr &&
        sum_over("world", signal != 0 ? 1 : 0) > 0 && signal == 0)
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
  if (options.checkpoint != nullptr) {
    options.checkpoint->wait();
    result.checkpoint = options.checkpoint->last_saved();
  }
  clear_bar();
  std::fflush(stdout);
  result.iteration = iteration_;
  return result;
}

}  // namespace loom::core
