#include "core/train/run_config.h"

#include <fmt/format.h>

#include "core/util/errors.h"
#include "loom/cpp/nn/pipeline_stage.h"

namespace loom::core {
namespace {

// The value at `section`/`key` of a resolved spec (the core schema filled every default in;
// a missing one is a spec that was not resolved).
const nlohmann::json& at(const nlohmann::json& spec, const char* section, const char* key) {
  if (!spec.contains(section) || !spec[section].is_object() || !spec[section].contains(key))
    throw SpecError(fmt::format("/{}/{}", section, key),
                    "missing; the spec was not resolved (core/spec/spec.h, resolve_spec)");
  return spec[section][key];
}

// The component node at `section`/`key`, or null when absent.
nlohmann::json node(const nlohmann::json& spec, const char* section, const char* key) {
  if (spec.contains(section) && spec[section].is_object() && spec[section].contains(key))
    return spec[section][key];
  return nullptr;
}

RecomputePolicy recompute_policy(const std::string& name) {
  if (name == "full") return RecomputePolicy::kFull;
  if (name == "selective") return RecomputePolicy::kSelective;
  if (name == "none") return RecomputePolicy::kNone;
  throw SpecError("/train/recompute",
                  fmt::format("'{}' is not one of none, selective, full", name));
}

void check(const RunConfig& c) {
  const ParallelConfig& par = c.parallel;
  std::string format = c.checkpoint.format.value("impl", "sharded");
  if (par.saves_together() && format != "sharded")
    throw SpecError(
        "/checkpoint/format",
        fmt::format("'{}' keeps whole tensors, but with tp > 1, pp > 1, ep > 1, etp > 1 or the "
                    "distributed optimizer "
                    "every rank saves its slices; use the sharded format (and `loom checkpoint "
                    "convert` for a {} copy)",
                    format, format));
  if (par.vpp != 1 && par.pp == 1)
    throw SpecError("/parallel/vpp",
                    fmt::format("{} virtual pipeline chunks need pipeline parallelism "
                                "(parallel.pp > 1); set it to 1",
                                par.vpp));
  const TrainConfig& t = c.train;
  if (par.cp > 1 && t.seq_length % (2 * par.cp) != 0)
    throw SpecError("/train/seq_length",
                    fmt::format("{} is not divisible by 2 x parallel.cp = {}: context "
                                "parallelism cuts every sequence into 2 cp equal chunks (rank r "
                                "holds chunks r and 2cp-1-r); choose a multiple of {}",
                                t.seq_length, 2 * par.cp, 2 * par.cp));
  if (par.cp > 1 && par.sequence_parallel && t.seq_length / par.cp % par.tp != 0)
    throw SpecError(
        "/train/seq_length",
        fmt::format("{} / parallel.cp {} = {} tokens per context-parallel rank are "
                    "not divisible by parallel.tp {} for sequence parallelism; "
                    "choose a multiple of {}",
                    t.seq_length, par.cp, t.seq_length / par.cp, par.tp, 2 * par.cp * par.tp));
  if (par.sequence_parallel && t.seq_length % par.tp != 0)
    throw SpecError("/train/seq_length",
                    fmt::format("{} is not divisible by parallel.tp {}: sequence "
                                "parallelism splits every sequence into tp equal shards; "
                                "choose a multiple of {}",
                                t.seq_length, par.tp, par.tp));
}

}  // namespace

void RunConfig::check_batch() const {
  int64_t replicas = parallel.batch_replicas();
  if (train.global_batch_size % (train.micro_batch_size * replicas) != 0)
    throw SpecError("/train/global_batch_size",
                    fmt::format("{} is not a multiple of micro_batch_size x dp = {} x {}",
                                train.global_batch_size, train.micro_batch_size, replicas));
}

std::string ParallelConfig::describe() const {
  return fmt::format("tp={} cp={} ep={} dp={} pp={}", tp, cp, ep, dp, pp);
}

RunConfig RunConfig::from_spec(const nlohmann::json& spec) {
  RunConfig c;
  ParallelConfig& par = c.parallel;
  par.tp = at(spec, "parallel", "tp").get<int>();
  par.cp = at(spec, "parallel", "cp").get<int>();
  par.ep = at(spec, "parallel", "ep").get<int>();
  const nlohmann::json& etp = at(spec, "parallel", "etp");
  par.etp = etp.is_null() ? 0 : etp.get<int>();
  par.dp = at(spec, "parallel", "dp").get<int>();
  par.pp = at(spec, "parallel", "pp").get<int>();
  par.vpp = at(spec, "parallel", "vpp").get<int>();
  par.cp_comm_type = at(spec, "parallel", "cp_comm_type").get<std::string>();
  par.sequence_parallel = at(spec, "parallel", "sequence_parallel").get<bool>();
  par.distributed_optimizer = at(spec, "parallel", "distributed_optimizer").get<bool>();
  par.overlap_grad_reduce = at(spec, "parallel", "overlap_grad_reduce").get<bool>();
  par.bucket_size = at(spec, "parallel", "bucket_size").get<int64_t>();
  par.timeout_s = at(spec, "parallel", "timeout_s").get<double>();
  par.pipeline_schedule = node(spec, "parallel", "pipeline_schedule");
  // The layer split of a pipeline, checked here for what needs no model (the layout's
  // grammar and stage count, the options that exclude each other); the model checks the
  // layers themselves when it is built.
  const nlohmann::json& p = spec.at("parallel");
  nlohmann::json& split = par.pipeline_split;
  if (p.contains("pipeline_layout")) {
    const std::string layout = p["pipeline_layout"].get<std::string>();
    int64_t stages = 0;
    try {
      stages = static_cast<int64_t>(nn::expand_pipeline_layout(layout).size());
    } catch (const Error& e) {
      // "#/parallel/pipeline_layout: '...' RULE"
      std::string why = e.what();
      throw SpecError("/parallel/pipeline_layout", why.substr(why.find(": ") + 2));
    }
    if (stages % par.pp != 0)
      throw SpecError("/parallel/pipeline_layout",
                      fmt::format("'{}' has {} stages, not a multiple of parallel.pp {}", layout,
                                  stages, par.pp));
    const int chunks = static_cast<int>(stages / par.pp);
    if (par.vpp != 1 && par.vpp != chunks)
      throw SpecError("/parallel/vpp",
                      fmt::format("{} differs from the layout's {} stages / parallel.pp {} = {} "
                                  "virtual chunks; leave vpp at 1 (it is inferred) or make them "
                                  "agree",
                                  par.vpp, stages, par.pp, chunks));
    par.vpp = chunks;
    split["layout"] = layout;
    for (const char* other :
         {"num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"})
      if (p.contains(other))
        throw SpecError(std::string("/parallel/") + other,
                        "cannot be combined with parallel.pipeline_layout (the layout places "
                        "every layer); remove one");
    for (const char* other :
         {"account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"})
      if (p.value(other, false))
        throw SpecError(std::string("/parallel/") + other,
                        "cannot be combined with parallel.pipeline_layout (the layout places "
                        "the embedding and the loss); remove one");
  }
  if (p.contains("num_layers_in_first_pipeline_stage"))
    split["first_stage_layers"] = p["num_layers_in_first_pipeline_stage"];
  if (p.contains("num_layers_in_last_pipeline_stage"))
    split["last_stage_layers"] = p["num_layers_in_last_pipeline_stage"];
  split["account_for_embedding"] = p.value("account_for_embedding_in_pipeline_split", false);
  split["account_for_loss"] = p.value("account_for_loss_in_pipeline_split", false);
  const bool uneven = split.contains("layout") || split.contains("first_stage_layers") ||
                      split.contains("last_stage_layers") ||
                      split["account_for_embedding"].get<bool>() ||
                      split["account_for_loss"].get<bool>();
  if (uneven && par.pp == 1)
    throw SpecError("/parallel/pp",
                    "1: a pipeline layout or uneven stages (parallel.pipeline_layout, "
                    "num_layers_in_first/last_pipeline_stage, account_for_*) need parallel.pp > "
                    "1; remove them or raise pp");
  par.comm_backend = node(spec, "parallel", "comm_backend");
  par.device_comm_backend = node(spec, "parallel", "device_comm_backend");

  PrecisionConfig& pr = c.precision;
  std::string params = at(spec, "precision", "params").get<std::string>();
  pr.params = dtype_from_name(params.c_str());
  if (pr.params != DType::kF32 && pr.params != DType::kBF16 && pr.params != DType::kF16)
    throw SpecError("/precision/params", fmt::format("unknown dtype '{}'", params));
  pr.initial_loss_scale = at(spec, "precision", "initial_loss_scale").get<double>();
  pr.min_loss_scale = at(spec, "precision", "min_loss_scale").get<double>();
  pr.loss_scale_window = at(spec, "precision", "loss_scale_window").get<int64_t>();
  pr.hysteresis = at(spec, "precision", "hysteresis").get<int64_t>();
  pr.fp8 = node(spec, "precision", "fp8");
  pr.fp8_weight_cache = at(spec, "precision", "fp8_weight_cache").get<bool>();

  TrainConfig& t = c.train;
  t.steps = at(spec, "train", "steps").get<int64_t>();
  t.micro_batch_size = at(spec, "train", "micro_batch_size").get<int64_t>();
  t.seq_length = at(spec, "train", "seq_length").get<int64_t>();
  t.global_batch_size = spec["train"].contains("global_batch_size")
                            ? spec["train"]["global_batch_size"].get<int64_t>()
                            : t.micro_batch_size * par.batch_replicas();
  t.seed = at(spec, "train", "seed").get<uint64_t>();
  t.device_name = at(spec, "train", "device").get<std::string>();
  t.device = t.device_name == "cuda" ? DeviceType::kCuda : DeviceType::kCpu;
  t.grad_clip = at(spec, "train", "grad_clip").get<double>();
  t.log_interval = at(spec, "train", "log_interval").get<int64_t>();
  t.eval_interval = at(spec, "train", "eval_interval").get<int64_t>();
  t.eval_steps = at(spec, "train", "eval_steps").get<int64_t>();
  t.max_nonfinite_steps = at(spec, "train", "max_nonfinite_steps").get<int64_t>();
  t.validate_results = at(spec, "train", "rerun_mode").get<std::string>() == "validate_results";
  t.check_for_spiky_loss = at(spec, "train", "check_for_spiky_loss").get<bool>();
  t.spiky_loss_factor = at(spec, "train", "spiky_loss_factor").get<double>();
  t.spiky_loss_samples = at(spec, "train", "spiky_loss_samples").get<int64_t>();
  const std::string graph = at(spec, "train", "cuda_graph").get<std::string>();
  t.cuda_graph = graph == "forward_backward" || graph == "step";
  t.cuda_graph_update = graph == "step";
  t.cuda_graph_warmup_steps = at(spec, "train", "cuda_graph_warmup_steps").get<int64_t>();
  if (t.check_for_spiky_loss && !t.validate_results)
    throw SpecError("/train/check_for_spiky_loss",
                    "a spiky loss is checked by rerunning its step: set /train/rerun_mode to "
                    "\"validate_results\" too (or check_for_spiky_loss to false)");
  t.recompute = recompute_policy(at(spec, "train", "recompute").get<std::string>());

  CheckpointConfig& ck = c.checkpoint;
  ck.format = node(spec, "checkpoint", "format");
  if (ck.format.is_null()) ck.format = {{"impl", "sharded"}};
  if (spec["checkpoint"].contains("dir")) ck.dir = spec["checkpoint"]["dir"].get<std::string>();
  ck.interval = spec["checkpoint"].value("interval", int64_t{0});
  ck.keep = at(spec, "checkpoint", "keep").get<int64_t>();
  ck.resume_auto = at(spec, "checkpoint", "resume").get<std::string>() == "auto";
  ck.async = at(spec, "checkpoint", "async").get<bool>();
  ck.save_at_end = at(spec, "checkpoint", "save_at_end").get<bool>();
  if (spec["checkpoint"].contains("init_from"))
    ck.init_from = spec["checkpoint"]["init_from"].get<std::string>();

  c.kernels = KernelsConfig::from_json(spec.value("kernels", nlohmann::json::object()));

  c.log.level = at(spec, "log", "level").get<std::string>();
  if (spec["log"].contains("run_dir")) c.log.run_dir = spec["log"]["run_dir"].get<std::string>();
  c.log.sample = node(spec, "log", "sample");
  c.log.trace_steps = at(spec, "log", "trace_steps").get<int64_t>();
  c.log.straggler_factor = at(spec, "log", "straggler_factor").get<double>();
  check(c);
  return c;
}

}  // namespace loom::core
