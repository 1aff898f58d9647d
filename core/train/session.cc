#include "core/train/session.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "core/checkpoint/checkpoint.h"
#include "core/component/builder.h"
#include "core/data/tokenizer.h"
#include "core/launch/store.h"
#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/hash.h"
#include "core/util/log.h"
#include "loom/cpp/json_input.h"
#include "loom/cpp/nn/pipeline_stage.h"
#include "loom/kinds.h"

namespace fs = std::filesystem;

namespace loom::core {
namespace {

// What every rank must agree on: the plugins it loaded (name, version, file hash).
std::string plugin_fingerprint(const PluginManager& plugins) {
  nlohmann::json list = nlohmann::json::array();
  for (const LoadedPlugin& p : plugins.loaded()) {
    std::string hash;
    try {
      hash = file_digest(p.record->library);
    } catch (const std::exception&) {
      hash = "unreadable";
    }
    list.push_back({{"name", p.record->name},
                    {"version", p.info->version},
                    {"hash", hash},
                    {"file", p.record->library.string()}});
  }
  return list.dump();
}

// The peer's text comes from the rendezvous store: another loom build (or a damaged store)
// may have written something else, which is then quoted instead of explained.
std::string explain_plugins_of(const std::string& mine, const std::string& theirs);
std::string explain_spec_of(const std::string& mine, const std::string& theirs);

std::string quoted(const std::string& text) {
  return text.size() > 200 ? text.substr(0, 197) + "..." : text;
}

std::string explain_plugins(const std::string& mine, const std::string& theirs) {
  try {
    return explain_plugins_of(mine, theirs);
  } catch (const std::exception&) {
    return "it loaded other plugins (its list is not one this build reads: " + quoted(theirs) +
           "); install the same build on every rank";
  }
}

std::string explain_spec(const std::string& mine, const std::string& theirs) {
  try {
    return explain_spec_of(mine, theirs);
  } catch (const std::exception&) {
    return "the resolved spec differs (its text is not JSON this build reads: " +
           quoted(theirs) + "); give every rank the same spec and build";
  }
}

std::string explain_plugins_of(const std::string& mine, const std::string& theirs) {
  nlohmann::json a = parse_json_input(mine, "this rank's plugin list"),
                 b = parse_json_input(theirs, "the other rank's plugin list");
  for (const auto& pa : a) {
    const nlohmann::json* match = nullptr;
    for (const auto& pb : b)
      if (pb["name"] == pa["name"]) match = &pb;
    if (match == nullptr)
      return fmt::format("plugin '{}' is loaded on rank 0 but not there",
                         pa["name"].get<std::string>());
    if ((*match)["version"] != pa["version"] || (*match)["hash"] != pa["hash"])
      return fmt::format(
          "plugin '{}' is version {} ({}, hash {}) on rank 0 and version {} ({}, "
          "hash {}) there; install the same build on every rank",
          pa["name"].get<std::string>(), pa["version"].get<std::string>(),
          pa["file"].get<std::string>(), pa["hash"].get<std::string>(),
          (*match)["version"].get<std::string>(), (*match)["file"].get<std::string>(),
          (*match)["hash"].get<std::string>());
  }
  return "it loaded other plugins: " + theirs;
}

std::string explain_spec_of(const std::string& mine, const std::string& theirs) {
  nlohmann::json patch = nlohmann::json::diff(parse_json_input(mine, "this rank's spec"),
                                              parse_json_input(theirs, "the other rank's spec"));
  std::string where;
  for (const auto& op : patch) where += (where.empty() ? "" : ", ") + op.value("path", "");
  return "the resolved spec differs at " + where + "; give every rank the same spec";
}

}  // namespace

std::unique_ptr<RunSession> RunSession::open(nlohmann::json spec,
                                             std::unique_ptr<Catalog> catalog) {
  std::unique_ptr<RunSession> s(new RunSession());
  if (!spec.contains("model"))
    throw SpecError("/model", "missing: training needs a model node {\"impl\": NAME, ...}");
  s->env_ = launch::detect_rank_env();
  // Several ranks talk through a comm_backend plugin: Gloo unless the spec names one.
  if (s->env_.distributed()) {
    nlohmann::json& par = spec["parallel"];
    if (!(par.is_object() && par.contains("comm_backend")))
      par["comm_backend"] = {{"impl", "gloo"}};
    // Device tensors go over NCCL unless the spec names another backend for them.
    const nlohmann::json& train = spec["train"];
    bool on_device = train.is_object() && train.value("device", "cpu") != "cpu";
    if (on_device && !par.contains("device_comm_backend"))
      par["device_comm_backend"] = {{"impl", "nccl"}};
  }
  // A pipeline runs Megatron's default schedule unless the spec names one: 1f1b, or the
  // interleaved 1F1B with virtual chunks.
  if (spec.contains("parallel") && spec["parallel"].is_object()) {
    nlohmann::json& par = spec["parallel"];
    auto count = [&](const char* key) {
      return par.contains(key) && par[key].is_number_integer() ? par[key].get<int64_t>() : 1;
    };
    // Virtual chunks as parallel.vpp sets them or the layout implies (its stages / pp).
    int64_t chunks = count("vpp");
    if (par.contains("pipeline_layout") && par["pipeline_layout"].is_string() && count("pp") > 1) {
      try {
        const auto stages = nn::expand_pipeline_layout(par["pipeline_layout"].get<std::string>());
        chunks = std::max<int64_t>(chunks, static_cast<int64_t>(stages.size()) / count("pp"));
      } catch (const Error&) {
        // A malformed layout: RunConfig names the rule it breaks.
      }
    }
    if (count("pp") > 1 && !par.contains("pipeline_schedule"))
      par["pipeline_schedule"] = {{"impl", chunks > 1 ? "interleaved" : "1f1b"}};
  }
  s->uses_ = resolve_spec(spec, *catalog);
  s->spec_ = std::move(spec);
  s->config_ = RunConfig::from_spec(s->spec_);
  LogLevel level;
  if (parse_log_level(s->config_.log.level, &level)) set_log_level(level);
  s->plugins_ = std::make_unique<PluginManager>(std::move(*catalog), s->spec_["plugins"]["options"],
                                                s->config_.train.seed);
  load_plugins_for(s->spec_, s->uses_, *s->plugins_);
  s->check_layout();
  s->join();
  return s;
}

RunSession::~RunSession() {
  if (plugins_) plugins_->host().set_groups(nullptr);
}

void RunSession::set_data(const nlohmann::json& data) { spec_["data"] = data; }

void RunSession::set_run_dir(const fs::path& run_dir) {
  spec_["log"]["run_dir"] = run_dir.string();
}

void RunSession::check_layout() const {
  const ParallelConfig& par = config_.parallel;
  int64_t world = par.world();
  if (env_.world_size == 1 && world > 1)
    throw SpecError("/parallel",
                    fmt::format("tp x cp x ep x dp x pp = {} ranks, but this process runs alone; "
                                "start the ranks with `loom train SPEC --nproc {}` (or `loom "
                                "launch --nproc {} -- loom train SPEC`, srun, mpirun)",
                                world, world, world));
  if (env_.world_size != world)
    throw SpecError(
        "/parallel",
        fmt::format("tp x cp x ep x dp x pp = {} x {} x {} x {} x {} = {} ranks, but {} were "
                    "started ({}); make the product equal the number of ranks",
                    par.tp, par.cp, par.ep, par.dp, par.pp, world, env_.world_size, env_.launcher));
}

void RunSession::join() {
  if (!env_.distributed()) return;
  const ParallelConfig& par = config_.parallel;
  ProcessGrid grid(par.grid_sizes(), env_.rank, par.etp);
  auto timeout_ms = static_cast<int64_t>(par.timeout_s * 1000);
  ObjectPtr backend = build_component(*plugins_, par.comm_backend, kinds::kCommBackend,
                                      "/parallel/comm_backend", nlohmann::json::object());
  parallel_ = std::make_unique<ParallelState>(grid, launch::open_store(env_.rdzv, env_.run_id),
                                              std::move(backend), timeout_ms,
                                              RoleOptions{par.distributed_optimizer});
  if (!par.device_comm_backend.is_null() && config_.train.device != DeviceType::kCpu)
    parallel_->set_device_backend(
        build_component(*plugins_, par.device_comm_backend, kinds::kCommBackend,
                        "/parallel/device_comm_backend", nlohmann::json::object()),
        DeviceType::kCuda);
  plugins_->host().set_groups(parallel_.get());
  parallel_->check_agreement("plugins", plugin_fingerprint(*plugins_), explain_plugins);
  parallel_->check_agreement("spec", spec_.dump(), explain_spec);
  // Only rank 0 speaks on stdout (progress, banner); every rank keeps stderr for errors.
  if (!rank0()) {
    std::fflush(stdout);
    if (std::freopen("/dev/null", "w", stdout) == nullptr) return;
  }
}

CheckpointWriterOptions RunSession::checkpoint_writer_options(
    const fs::path& run_dir, const std::optional<fs::path>& tokenizer) {
  const CheckpointConfig& ck = config_.checkpoint;
  CheckpointWriterOptions o;
  o.root = ck.dir.empty() ? run_dir / "checkpoints" : fs::path(ck.dir);
  o.format = ck.format;
  o.keep = ck.keep;
  o.async = ck.async;
  if (tokenizer) o.extra_files = tokenizer_files(*tokenizer, "tokenizer/");
  // Pure data parallelism: rank 0 holds every parameter and optimizer state and saves them
  // alone, in any format. Tensor parallelism and the distributed optimizer spread them
  // over the ranks, which save together, each its slices (the sharded format).
  if (config_.parallel.saves_together() && parallel_) o.world = &parallel_->comm("world");
  return o;
}

void truncate_metrics(const fs::path& path, int64_t iteration) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    // metrics.jsonl may have been edited or damaged: a line nested too deep, not JSON, or
    // without an integer "step" is kept as it is rather than ending the resume.
    if (json_too_deep_at(line) != std::string::npos) {
      kept += line + "\n";
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() > iteration)
      continue;
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

bool resume_from_latest(Trainer& trainer, PluginManager& plugins, const fs::path& root, bool owner,
                        ICommunicator* world) {
  if (owner) remove_stale_latest(root);
  std::vector<fs::path> all = list_checkpoints(root);
  if (all.empty()) {
    std::printf("  resume: no checkpoint in %s yet; starting from scratch\n",
                root.string().c_str());
    return false;
  }
  // What `latest` says, to explain a choice that differs from it.
  std::optional<fs::path> latest = read_latest(root);
  std::string latest_says =
      latest ? fmt::format("`latest` names {}", latest->filename().string()) : latest_problem(root);
  std::vector<std::string> failures;
  for (const fs::path& dir : all) {
    std::string error;
    std::vector<FileCheck> reader_files;
    try {
      CheckpointReader reader(plugins, dir);
      trainer.restore(reader);
      // The tokenizer copy does not hold training state: damage there is worth a warning
      // (generation from this checkpoint needs it), not a fallback past the checkpoint.
      reader_files = reader.check_files();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (world != nullptr && world->size() > 1) {
      int32_t failed = error.empty() ? 0 : 1;
      TensorView flag = make_view(&failed, DType::kI32, {1}, Device{DeviceType::kCpu, 0});
      throw_if_error(world->all_reduce(&flag, ReduceOp::kMax, nullptr),
                     "resume: agreeing on the checkpoint");
      if (failed != 0 && error.empty())
        error = "another rank could not load its part (its log says why)";
    }
    if (!error.empty()) {
      failures.push_back(fmt::format("{}: {}", dir.filename().string(), error));
      log_warning("checkpoint", fmt::format("cannot resume from {}: {}; trying the one "
                                            "before it",
                                            dir.string(), error));
      continue;
    }
    std::printf("  resume: iteration %lld from %s\n", static_cast<long long>(trainer.iteration()),
                dir.string().c_str());
    if (!latest || *latest != dir)
      log_warning("checkpoint",
                  fmt::format("{}; resuming from {}, {}", latest_says, dir.filename().string(),
                              dir == all.front() ? "the newest complete checkpoint"
                                                 : "the newest one that loads"));
    for (const FileCheck& c : reader_files)
      if (!c.problem.empty()) log_warning("checkpoint", c.problem);
    for (const fs::path& bad : all) {
      if (bad == dir || !owner) break;
      std::error_code ec;
      fs::path aside = bad;
      aside += ".unusable";
      fs::rename(bad, aside, ec);
      log_warning("checkpoint", fmt::format("fell back past {}; it is kept as {} for inspection",
                                            bad.filename().string(), aside.filename().string()));
    }
    if (owner) write_file_atomic(root / "latest", dir.filename().string() + "\n");
    return true;
  }
  std::string all_failures;
  for (const std::string& f : failures) all_failures += "; " + f;
  throw Error(Code::kDataLoss,
              fmt::format("checkpoint.resume=auto: none of the {} checkpoints in {} can be "
                          "loaded{}. Fix or remove them, or set checkpoint.resume=none to start "
                          "from scratch",
                          all.size(), root.string(), all_failures));
}

}  // namespace loom::core
