// loom train SPEC [--set PATH=VALUE]... [--run-dir DIR] [--plugin-path DIR]
// loom bench SPEC [--steps N] [--warmup N] [--set ...]: warm-up plus timed steps on
// synthetic tokens; prints tokens/s, ms/step, MFU and peak memory.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>

#include "core/build/builder.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/data/tokenizer.h"
#include "core/dist/rank_env.h"
#include "core/dist/store.h"
#include "core/infer/generator.h"
#include "core/parallel/parallel_state.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/schema.h"
#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/hash.h"
#include "core/util/log.h"
#include "loom/kinds.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {
namespace {

// Reads, validates and resolves the spec, loads its plugins; shared by train and bench.
// A multi-process run also has this rank's place in it; `parallel` is null for one process.
struct Session {
  ResolvedSpec spec;
  std::unique_ptr<core::PluginManager> plugins;
  std::unique_ptr<core::ParallelState> parallel;
  core::dist::RankEnv env;
  bool rank0() const { return env.rank == 0; }
  Session() = default;
  Session(Session&&) = default;
  ~Session() {
    if (plugins) plugins->host().set_communicators(nullptr);
  }
};

int64_t world_of(const nlohmann::json& par) {
  int64_t world = 1;
  for (const char* dim : {"tp", "cp", "ep", "dp", "pp"}) world *= par[dim].get<int64_t>();
  return world;
}

// Checks the layout against the ranks that were started, before anything is loaded.
// Tensor parallelism and the distributed optimizer spread parameters and optimizer states
// over the ranks, which then save checkpoints together, each its slices.
bool saves_together(const nlohmann::json& par) {
  return par["tp"].get<int64_t>() > 1 ||
         (par["dp"].get<int64_t>() > 1 && par["distributed_optimizer"].get<bool>());
}

void check_layout(const nlohmann::json& spec, const core::dist::RankEnv& env) {
  const nlohmann::json& par = spec["parallel"];
  const nlohmann::json& ckpt = spec["checkpoint"];
  std::string format =
      ckpt.contains("format") ? ckpt["format"].value("impl", "sharded") : "sharded";
  if (saves_together(par) && format != "sharded")
    throw core::SpecError(
        "/checkpoint/format",
        fmt::format("'{}' keeps whole tensors, but with tp > 1 or the distributed optimizer "
                    "every rank saves its slices; use the sharded format (and `loom checkpoint "
                    "convert` for a {} copy)",
                    format, format));
  for (const char* dim : {"cp", "ep", "pp"})
    if (par[dim].get<int64_t>() != 1)
      throw Error(Code::kUnimplemented,
                  fmt::format("spec /parallel/{}: {} is not available in this loom yet (data, "
                              "tensor and sequence parallelism and the distributed optimizer "
                              "are); set it to 1",
                              dim, par[dim].get<int64_t>()));
  int64_t tp = par["tp"].get<int64_t>(), seq = spec["train"]["seq_length"].get<int64_t>();
  if (par["sequence_parallel"].get<bool>() && seq % tp != 0)
    throw core::SpecError("/train/seq_length",
                          fmt::format("{} is not divisible by parallel.tp {}: sequence "
                                      "parallelism splits every sequence into tp equal shards; "
                                      "choose a multiple of {}",
                                      seq, tp, tp));
  int64_t world = world_of(par);
  if (env.world_size == 1 && world > 1)
    throw core::SpecError(
        "/parallel", fmt::format("tp x cp x ep x dp x pp = {} ranks, but this process runs alone; "
                                 "start the ranks with `loom train SPEC --nproc {}` (or `loom "
                                 "launch --nproc {} -- loom train SPEC`, srun, mpirun)",
                                 world, world, world));
  if (env.world_size != world)
    throw core::SpecError(
        "/parallel",
        fmt::format("tp x cp x ep x dp x pp = {} x {} x {} x {} x {} = {} ranks, but {} were "
                    "started ({}); make the product equal the number of ranks",
                    par["tp"].get<int64_t>(), par["cp"].get<int64_t>(), par["ep"].get<int64_t>(),
                    par["dp"].get<int64_t>(), par["pp"].get<int64_t>(), world, env.world_size,
                    env.launcher));
}

// What every rank must agree on: the plugins it loaded (name, version, file hash).
std::string plugin_fingerprint(const core::PluginManager& plugins) {
  nlohmann::json list = nlohmann::json::array();
  for (const core::LoadedPlugin& p : plugins.loaded()) {
    std::string hash;
    try {
      hash = core::file_digest(p.record->library);
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

std::string explain_plugins(const std::string& mine, const std::string& theirs) {
  nlohmann::json a = nlohmann::json::parse(mine), b = nlohmann::json::parse(theirs);
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

std::string explain_spec(const std::string& mine, const std::string& theirs) {
  nlohmann::json patch =
      nlohmann::json::diff(nlohmann::json::parse(mine), nlohmann::json::parse(theirs));
  std::string where;
  for (const auto& op : patch) where += (where.empty() ? "" : ", ") + op.value("path", "");
  return "the resolved spec differs at " + where + "; give every rank the same spec";
}

// Joins the run when this process is one of several ranks: the rendezvous store, the
// communication backend, the process grid; then checks that every rank loaded the same
// plugins and resolved the same spec.
void join_run(Session& s) {
  const nlohmann::json& par = s.spec.spec["parallel"];
  if (!s.env.distributed()) return;
  std::array<int, 5> sizes{par["tp"].get<int>(), par["cp"].get<int>(), par["ep"].get<int>(),
                           par["dp"].get<int>(), par["pp"].get<int>()};
  core::ProcessGrid grid(sizes, s.env.rank);
  auto timeout_ms = static_cast<int64_t>(par["timeout_s"].get<double>() * 1000);
  core::ObjectPtr backend =
      core::build_component(*s.plugins, par["comm_backend"], kinds::kCommBackend,
                            "/parallel/comm_backend", nlohmann::json::object());
  s.parallel = std::make_unique<core::ParallelState>(
      grid, core::dist::open_store(s.env.rdzv, s.env.run_id), std::move(backend), timeout_ms);
  if (par.contains("device_comm_backend") && s.spec.spec["train"]["device"] != "cpu")
    s.parallel->set_device_backend(
        core::build_component(*s.plugins, par["device_comm_backend"], kinds::kCommBackend,
                              "/parallel/device_comm_backend", nlohmann::json::object()),
        DeviceType::kCuda);
  core::ParallelState* state = s.parallel.get();
  s.plugins->host().set_communicators(
      [state](const std::string& dims) { return &state->comm(dims); });
  state->check_agreement("plugins", plugin_fingerprint(*s.plugins), explain_plugins);
  state->check_agreement("spec", s.spec.spec.dump(), explain_spec);
  // Only rank 0 speaks on stdout (progress, banner); every rank keeps stderr for errors.
  if (!s.rank0()) {
    std::fflush(stdout);
    if (std::freopen("/dev/null", "w", stdout) == nullptr) return;
  }
}

Session open_session(const Args& args) {
  Session s;
  s.spec = read_spec(args);
  if (!s.spec.spec.contains("model"))
    throw core::SpecError("/model", "missing: training needs a model node {\"impl\": NAME, ...}");
  s.env = core::dist::detect_rank_env();
  // Several ranks talk through a comm_backend plugin: Gloo unless the spec names one.
  if (s.env.distributed()) {
    nlohmann::json& par = s.spec.spec["parallel"];
    if (!(par.is_object() && par.contains("comm_backend")))
      par["comm_backend"] = {{"impl", "gloo"}};
    // Device tensors go over NCCL unless the spec names another backend for them.
    const nlohmann::json& train = s.spec.spec["train"];
    bool on_device = train.is_object() && train.value("device", "cpu") != "cpu";
    if (on_device && !par.contains("device_comm_backend"))
      par["device_comm_backend"] = {{"impl", "nccl"}};
  }
  s.spec.uses = core::resolve_spec(s.spec.spec, *s.spec.catalog);
  const nlohmann::json& log = s.spec.spec["log"];
  LogLevel level;
  if (core::parse_log_level(log["level"].get<std::string>(), &level)) core::set_log_level(level);
  s.plugins = std::make_unique<core::PluginManager>(std::move(*s.spec.catalog),
                                                    s.spec.spec["plugins"]["options"],
                                                    s.spec.spec["train"]["seed"].get<uint64_t>());
  load_plugins_for(s.spec, *s.plugins);
  check_layout(s.spec.spec, s.env);
  join_run(s);
  return s;
}

void print_layout(const Session& s, const fs::path& run_dir) {
  const nlohmann::json& par = s.spec.spec["parallel"];
  std::printf("  run dir: %s\n  layout: tp=%d cp=%d ep=%d dp=%d pp=%d (world size %lld%s%s%s)\n",
              run_dir.string().c_str(), par["tp"].get<int>(), par["cp"].get<int>(),
              par["ep"].get<int>(), par["dp"].get<int>(), par["pp"].get<int>(),
              static_cast<long long>(world_of(par)),
              par["sequence_parallel"].get<bool>() ? ", sequence parallel" : "",
              par["distributed_optimizer"].get<bool>() ? ", distributed optimizer" : "",
              s.env.distributed() ? fmt::format(", started by {}, {} backend", s.env.launcher,
                                                par["comm_backend"]["impl"].get<std::string>())
                                        .c_str()
                                  : "");
  for (const core::LoadedPlugin& p : s.plugins->loaded())
    std::printf("  plugin %s %s (%s)\n", p.record->name.c_str(), p.info->version,
                p.record->library.string().c_str());
}

// --nproc N: this command again, as N ranks under the launcher. Unless the user chose,
// the ranks share this machine's cores (torchrun does the same with OMP_NUM_THREADS).
int nproc_of(const Args& args) {
  int64_t n = args.integer("--nproc", 1, 1, 4096);
  if (core::dist::detect_rank_env().launcher != "single")
    throw core::UsageError(
        "--nproc: this process is already a rank of a launched run; drop --nproc");
  int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  setenv("OMP_NUM_THREADS", std::to_string(std::max<int64_t>(1, cores / n)).c_str(), 0);
  return static_cast<int>(n);
}

std::vector<std::string> without_nproc(const std::string& command,
                                       const std::vector<std::string>& argv) {
  std::vector<std::string> out{command};
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--nproc") {
      ++i;
      continue;
    }
    if (argv[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

// The first signal asks the run to finish its step, save and stop; a second one stops
// at once (the default action).
std::atomic<int> g_stop_signal{0};

void on_stop_signal(int signal) {
  if (g_stop_signal.exchange(signal) != 0) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  const char message[] =
      "\nloom: signal received: finishing the step, then saving (again to stop now)\n";
  ssize_t ignored = write(STDERR_FILENO, message, sizeof(message) - 1);
  (void)ignored;
}

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// Drops the lines of metrics.jsonl after `iteration` (a resumed run logs them again).
void truncate_metrics(const fs::path& path, int64_t iteration) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("step", int64_t{0}) > iteration) continue;
    kept += line + "\n";
  }
  core::write_file_atomic(path, kept);
}

// Resumes from the newest checkpoint under `root` that loads; checkpoints newer than that
// one are damaged or do not fit the model: they are renamed *.unusable and reported.
// Returns false when there is none. Throws when there are some but none loads.
// Only `owner` (rank 0) renames and rewrites `latest`; every rank loads. With several ranks
// (`world`), a checkpoint counts as loaded only when every rank loaded its part, so all
// ranks resume from the same one.
bool resume(core::Trainer& trainer, core::PluginManager& plugins, const fs::path& root, bool owner,
            ICommunicator* world) {
  std::vector<fs::path> all = core::list_checkpoints(root);
  if (all.empty()) {
    std::printf("  resume: no checkpoint in %s yet; starting from scratch\n",
                root.string().c_str());
    return false;
  }
  std::vector<std::string> failures;
  for (const fs::path& dir : all) {
    std::string error;
    try {
      core::CheckpointReader reader(plugins, dir);
      trainer.restore(reader);
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
      core::log_warning("checkpoint", fmt::format("cannot resume from {}: {}; trying the one "
                                                  "before it",
                                                  dir.string(), error));
      continue;
    }
    std::printf("  resume: iteration %lld from %s\n", static_cast<long long>(trainer.iteration()),
                dir.string().c_str());
    for (const fs::path& bad : all) {
      if (bad == dir || !owner) break;
      std::error_code ec;
      fs::path aside = bad;
      aside += ".unusable";
      fs::rename(bad, aside, ec);
      core::log_warning("checkpoint",
                        fmt::format("fell back past {}; it is kept as {} for inspection",
                                    bad.filename().string(), aside.filename().string()));
    }
    if (owner) core::write_file_atomic(root / "latest", dir.filename().string() + "\n");
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

// The short sample a run prints at its end (/log/sample): the trained weights, decoded
// with a KV cache from the prompt (or from the end-of-document token when it is empty).
void print_sample(const Session& s, core::Trainer& trainer) {
  const nlohmann::json& spec = s.spec.spec;
  if (!spec["log"].contains("sample")) return;
  if (!trainer.tokenizer_path()) {
    std::printf("sample: skipped (the data has no tokenizer to turn tokens into text)\n");
    return;
  }
  const nlohmann::json& o = spec["log"]["sample"];
  std::unique_ptr<core::Tokenizer> tokenizer = core::Tokenizer::load(*trainer.tokenizer_path());
  core::GeneratorOptions options = core::GeneratorOptions::from_spec(spec);
  options.device = trainer.device();  // decoded where the run trained
  core::Generator generator(*s.plugins, spec["model"], options);
  generator.copy_parameters_from(trainer.params());
  std::string prompt = o["prompt"].get<std::string>();
  std::vector<int32_t> ids = tokenizer->encode(prompt);
  std::optional<int32_t> eod = tokenizer->eod();
  if (ids.empty()) {
    if (!eod) return;
    ids.push_back(*eod);
  }
  core::GenerateOptions g;
  g.max_new_tokens = o["max_new_tokens"].get<int64_t>();
  g.sampling.temperature = o["temperature"].get<double>();
  g.sampling.top_k = o["top_k"].get<int64_t>();
  g.sampling.top_p = o["top_p"].get<double>();
  g.sampling.seed = o["seed"].get<uint64_t>();
  g.vocab_limit = tokenizer->vocab_size();
  core::Generation out = generator.generate(ids, g, eod);
  if (!out.tokens.empty() && eod && out.tokens.back() == *eod) out.tokens.pop_back();
  std::string text = tokenizer->decode(out.tokens);
  std::printf("sample (temperature %g, top-k %lld, top-p %g, seed %llu):\n%s%s\n",
              g.sampling.temperature, static_cast<long long>(g.sampling.top_k), g.sampling.top_p,
              static_cast<unsigned long long>(g.sampling.seed), prompt.c_str(), text.c_str());
}

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom train SPEC [--nproc N] [--set PATH=VALUE]... [--run-dir DIR] [--plugin-path DIR]";
  Args args =
      parse_args(argv, {{}, {"--set", "--run-dir", "--plugin-path", "--nproc"}, 1, 1, usage});
  if (!args.get("--nproc").empty())
    return relaunch_self(nproc_of(args), without_nproc("train", argv));
  Session s = open_session(args);

  // The run directory holds the resolved spec (defaults filled in) and metrics.
  const nlohmann::json& log = s.spec.spec["log"];
  fs::path run_dir = args.get("--run-dir");
  if (run_dir.empty())
    run_dir = log.contains("run_dir") ? fs::path(log["run_dir"].get<std::string>())
                                      : fs::path("runs") / s.spec.path.stem();
  s.spec.spec["log"]["run_dir"] = run_dir.string();
  if (s.rank0()) core::write_json_atomically(s.spec.spec, run_dir / "spec.resolved.json");

  std::printf("loom train %s\n", s.spec.path.string().c_str());
  print_layout(s, run_dir);
  core::Trainer trainer(s.spec.spec, *s.plugins, nullptr, nlohmann::json::object(),
                        s.parallel.get());
  trainer.print_banner(stdout);

  // Checkpoints: where, how, and where to start from.
  const nlohmann::json& ckpt = s.spec.spec["checkpoint"];
  core::CheckpointWriterOptions writer_options;
  writer_options.root =
      ckpt.contains("dir") ? fs::path(ckpt["dir"].get<std::string>()) : run_dir / "checkpoints";
  if (ckpt.contains("format")) writer_options.format = ckpt["format"];
  writer_options.keep = ckpt["keep"].get<int64_t>();
  writer_options.async = ckpt["async"].get<bool>();
  if (trainer.tokenizer_path())
    writer_options.extra_files = core::tokenizer_files(*trainer.tokenizer_path(), "tokenizer/");
  // Pure data parallelism: rank 0 holds every parameter and optimizer state and saves them
  // alone, in any format. Tensor parallelism and the distributed optimizer spread them
  // over the ranks, which save together, each its slices (the sharded format).
  const nlohmann::json& par = s.spec.spec["parallel"];
  bool together = saves_together(par);
  if (together && s.parallel) writer_options.world = &s.parallel->comm("world");
  core::CheckpointWriter writer(*s.plugins, writer_options);
  std::printf("  checkpoints: %s (%s%s, keep %lld%s)\n", writer_options.root.string().c_str(),
              writer_options.format["impl"].get<std::string>().c_str(),
              ckpt.contains("interval")
                  ? fmt::format(", every {} steps", ckpt["interval"].get<int64_t>()).c_str()
                  : "",
              static_cast<long long>(writer_options.keep), writer_options.async ? ", async" : "");
  bool resumed = false;
  if (ckpt["resume"].get<std::string>() == "auto")
    resumed = resume(trainer, *s.plugins, writer_options.root, s.rank0(),
                     s.parallel ? &s.parallel->comm("world") : nullptr);
  else if (!core::list_checkpoints(writer_options.root).empty())
    core::log_warning("checkpoint",
                      fmt::format("{} already holds checkpoints; this run starts from scratch and "
                                  "replaces those of the iterations it saves (set "
                                  "checkpoint.resume=auto to continue from them)",
                                  writer_options.root.string()));
  if (!resumed && ckpt.contains("init_from")) {
    core::CheckpointReader reader(*s.plugins, ckpt["init_from"].get<std::string>());
    trainer.load_weights(reader);
    std::printf("  init: model weights from %s\n", reader.dir().string().c_str());
  }
  if (s.rank0()) truncate_metrics(run_dir / "metrics.jsonl", trainer.iteration());
  std::fflush(stdout);

  core::RunOptions options;
  options.run_dir = s.rank0() ? run_dir : fs::path();
  options.checkpoint = s.rank0() || together ? &writer : nullptr;
  options.save_interval = ckpt.value("interval", int64_t{0});
  options.save_at_end = ckpt["save_at_end"].get<bool>();
  options.stop_signal = &g_stop_signal;
  install_stop_handlers();
  auto t0 = std::chrono::steady_clock::now();
  core::RunResult result = trainer.run(options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string saved = result.checkpoint ? result.checkpoint->string() : "nothing";
  if (result.stop_signal != 0) {
    std::printf(
        "stopped by %s at iteration %lld; checkpoint %s; continue with --set "
        "checkpoint.resume=auto\n",
        result.stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
        static_cast<long long>(result.iteration), saved.c_str());
    return core::kExitOk;
  }
  std::printf("done: %lld steps in %.1f s; metrics in %s; checkpoint %s\n",
              static_cast<long long>(trainer.iteration()), seconds,
              (run_dir / "metrics.jsonl").string().c_str(), saved.c_str());
  if (s.spec.spec["parallel"]["tp"].get<int64_t>() == 1) print_sample(s, trainer);
  return core::kExitOk;
}

int cmd_bench(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom bench SPEC [--nproc N] [--steps N] [--warmup N] [--set PATH=VALUE]... [--plugin-path "
      "DIR] [--json]";
  Args args = parse_args(
      argv,
      {{"--json"}, {"--set", "--steps", "--warmup", "--plugin-path", "--nproc"}, 1, 1, usage});
  if (!args.get("--nproc").empty())
    return relaunch_self(nproc_of(args), without_nproc("bench", argv));
  int64_t steps = args.integer("--steps", 10);
  int64_t warmup = args.integer("--warmup", 2);
  if (steps < 1) throw core::UsageError("--steps must be at least 1 (" + usage + ")");
  Session s = open_session(args);
  // Benchmarks measure compute: synthetic tokens, no evaluation, no files.
  s.spec.spec["data"] = {{"mock", true}, {"split", "949,50,1"}};
  bool json = args.flag("--json");
  core::Trainer trainer(s.spec.spec, *s.plugins, nullptr, nlohmann::json::object(),
                        s.parallel.get());
  if (!json) {
    std::printf("loom bench %s\n", s.spec.path.string().c_str());
    trainer.print_banner(stdout);
  }
  for (int64_t i = 0; i < warmup; ++i) trainer.step();
  std::vector<double> times;
  int64_t tokens = 0;
  double loss = 0, comm = 0;
  for (int64_t i = 0; i < steps; ++i) {
    core::StepResult r = trainer.step();
    times.push_back(r.seconds);
    tokens = r.tokens;
    loss = r.loss;
    comm += r.comm_seconds;
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double t : times) mean += t;
  double comm_share = comm / mean / static_cast<double>(times.size());
  mean /= static_cast<double>(times.size());
  double median = sorted[sorted.size() / 2];
  double tps = static_cast<double>(tokens) / mean;
  double mfu =
      trainer.peak_flops() > 0 ? trainer.flops_per_step() / mean / trainer.peak_flops() : 0;
  uint64_t peak = trainer.peak_memory();
  core::MemoryEstimate estimate = trainer.memory_estimate();
  if (json) {
    nlohmann::json out = {{"spec", s.spec.path.string()},
                          {"steps", steps},
                          {"warmup", warmup},
                          {"tokens_per_step", tokens},
                          {"ms_per_step_mean", 1e3 * mean},
                          {"ms_per_step_median", 1e3 * median},
                          {"tokens_per_s", tps},
                          {"mfu", mfu},
                          {"model_flops_per_step", trainer.flops_per_step()},
                          {"gemm_peak_flops", trainer.peak_flops()},
                          {"peak_mem_bytes", peak},
                          {"estimated_mem_bytes", estimate.total()},
                          {"estimated_mem", estimate.describe()},
                          {"world_size", s.env.world_size},
                          {"comm_share", comm_share},
                          {"last_loss", loss}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "bench: %lld timed steps after %lld warm-up | %.0f tok/s | %.1f ms/step (median %.1f) | "
        "MFU %.1f%% of %.1f GFLOP/s | achieved %.1f GFLOP/s | peak mem %.1f MiB%s\n",
        static_cast<long long>(steps), static_cast<long long>(warmup), tps, 1e3 * mean,
        1e3 * median, 100 * mfu, trainer.peak_flops() / 1e9, trainer.flops_per_step() / mean / 1e9,
        static_cast<double>(peak) / (1 << 20),
        s.env.distributed()
            ? fmt::format(" | {} ranks, {:.1f}% of the step blocked in communication (rank 0)",
                          s.env.world_size, 100 * comm_share)
                  .c_str()
            : "");
    if (estimate.activations)
      std::printf("bench: peak memory %.1f MiB is %+.1f%% of the analytic estimate, %s\n",
                  static_cast<double>(peak) / (1 << 20),
                  100.0 * (static_cast<double>(peak) / static_cast<double>(estimate.total()) - 1),
                  estimate.describe().c_str());
  }
  return core::kExitOk;
}

}  // namespace loom::cli
