// loom train SPEC [--nproc N] [--set PATH=VALUE]... [--run-dir DIR] [--plugin-path DIR]
// The command around core::RunSession and core::Trainer: the run directory, the banner,
// signals, checkpoints, the end-of-run sample.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/data/tokenizer.h"
#include "core/infer/generator.h"
#include "core/launch/rank_env.h"
#include "core/spec/spec.h"
#include "core/train/plan_simulator.h"
#include "core/train/session.h"
#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "core/util/log.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {

std::unique_ptr<core::RunSession> open_run_session(const Args& args) {
  ResolvedSpec read = read_spec(args);
  return core::RunSession::open(std::move(read.spec), std::move(read.catalog));
}

int nproc_of(const Args& args) {
  int64_t n = args.integer("--nproc", 1, 1, 4096);
  if (core::launch::detect_rank_env().launcher != "single")
    throw core::UsageError(
        "--nproc: this process is already a rank of a launched run; drop --nproc");
  // Unless the user chose, the ranks share this machine's cores (torchrun does the same
  // with OMP_NUM_THREADS).
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

namespace {

void print_layout(core::RunSession& s, const fs::path& run_dir) {
  const core::ParallelConfig& par = s.config().parallel;
  std::printf("  run dir: %s\n  layout: %s (world size %d%s%s%s%s)\n", run_dir.string().c_str(),
              par.describe().c_str(), par.world(),
              par.cp > 1 ? fmt::format(", context parallel by {}", par.cp_comm_type).c_str() : "",
              par.sequence_parallel ? ", sequence parallel" : "",
              par.distributed_optimizer ? ", distributed optimizer" : "",
              s.env().distributed() ? fmt::format(", started by {}, {} backend", s.env().launcher,
                                                  par.comm_backend.value("impl", "?"))
                                          .c_str()
                                    : "");
  if (par.pp > 1) {
    const std::string schedule = par.pipeline_schedule.value("impl", "?");
    const int64_t m = s.config().micro_batches();
    double bubble =
        core::theoretical_bubble(schedule, par.pp, static_cast<int32_t>(m), par.vpp);
    std::printf("  pipeline: %s, %d stages x %d virtual chunks, %lld micro-batches per step%s\n",
                schedule.c_str(), par.pp, par.vpp, static_cast<long long>(m),
                bubble >= 0 ? fmt::format(" (bubble in theory {:.1f}% with B = 2F)", 100 * bubble)
                                  .c_str()
                            : "");
  }
  for (const core::LoadedPlugin& p : s.plugins().loaded())
    std::printf("  plugin %s %s (%s)\n", p.record->name.c_str(), p.info->version,
                p.record->library.string().c_str());
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
  // A peer rank that died closes its sockets: a write to one must fail with an error that
  // the communicator reports (naming the group and the rank), not kill this rank with
  // SIGPIPE (the survivor of a killed data-parallel peer died so, now and then).
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

// The short sample a run prints at its end (/log/sample): the trained weights, decoded
// with a KV cache from the prompt (or from the end-of-document token when it is empty).
void print_sample(core::RunSession& s, core::Trainer& trainer) {
  const nlohmann::json& o = s.config().log.sample;
  if (o.is_null()) return;
  if (!trainer.tokenizer_path()) {
    std::printf("sample: skipped (the data has no tokenizer to turn tokens into text)\n");
    return;
  }
  std::unique_ptr<core::Tokenizer> tokenizer = core::Tokenizer::load(*trainer.tokenizer_path());
  core::GeneratorOptions options = core::GeneratorOptions::from_spec(s.spec());
  options.device = trainer.device();  // decoded where the run trained
  core::Generator generator(s.plugins(), s.spec()["model"], options);
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
  const fs::path spec_path = args.positionals.at(0);
  std::unique_ptr<core::RunSession> s = open_run_session(args);
  const core::RunConfig& config = s->config();

  // The run directory holds the resolved spec (defaults filled in) and metrics.
  fs::path run_dir = args.get("--run-dir");
  if (run_dir.empty())
    run_dir = !config.log.run_dir.empty() ? fs::path(config.log.run_dir)
                                          : fs::path("runs") / spec_path.stem();
  s->set_run_dir(run_dir);
  if (s->rank0()) core::write_json_atomically(s->spec(), run_dir / "spec.resolved.json");

  std::printf("loom train %s\n", spec_path.string().c_str());
  print_layout(*s, run_dir);
  core::Trainer trainer(s->spec(), s->plugins(), nullptr, nlohmann::json::object(), s->parallel());
  trainer.print_banner(stdout);

  // Checkpoints: where, how, and where to start from.
  core::CheckpointWriterOptions writer_options =
      s->checkpoint_writer_options(run_dir, trainer.tokenizer_path());
  core::CheckpointWriter writer(s->plugins(), writer_options);
  const core::CheckpointConfig& ckpt = config.checkpoint;
  std::printf("  checkpoints: %s (%s%s, keep %lld%s)\n", writer_options.root.string().c_str(),
              writer_options.format["impl"].get<std::string>().c_str(),
              ckpt.interval > 0 ? fmt::format(", every {} steps", ckpt.interval).c_str() : "",
              static_cast<long long>(writer_options.keep), writer_options.async ? ", async" : "");
  bool resumed = false;
  ICommunicator* world = s->parallel() ? &s->parallel()->comm("world") : nullptr;
  if (ckpt.resume_auto)
    resumed =
        core::resume_from_latest(trainer, s->plugins(), writer_options.root, s->rank0(), world);
  else if (!core::list_checkpoints(writer_options.root).empty())
    core::log_warning("checkpoint",
                      fmt::format("{} already holds checkpoints; this run starts from scratch and "
                                  "replaces those of the iterations it saves (set "
                                  "checkpoint.resume=auto to continue from them)",
                                  writer_options.root.string()));
  if (!resumed && !ckpt.init_from.empty()) {
    core::CheckpointReader reader(s->plugins(), ckpt.init_from);
    trainer.load_weights(reader);
    std::printf("  init: model weights from %s\n", reader.dir().string().c_str());
  }
  if (s->rank0()) core::truncate_metrics(run_dir / "metrics.jsonl", trainer.iteration());
  std::fflush(stdout);

  core::RunOptions options;
  options.run_dir = s->rank0() ? run_dir : fs::path();
  options.checkpoint = s->saves() ? &writer : nullptr;
  options.save_interval = ckpt.interval;
  options.save_at_end = ckpt.save_at_end;
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
  if (config.parallel.tp == 1) print_sample(*s, trainer);
  return core::kExitOk;
}

}  // namespace loom::cli
