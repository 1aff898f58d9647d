// loom train SPEC [--set PATH=VALUE]... [--run-dir DIR] [--plugin-path DIR]
// loom bench SPEC [--steps N] [--warmup N] [--set ...]: warm-up plus timed steps on
// synthetic tokens; prints tokens/s, ms/step, MFU and peak memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/plugin/plugin_manager.h"
#include "core/spec/schema.h"
#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "core/util/log.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {
namespace {

// Reads, validates and resolves the spec, loads its plugins; shared by train and bench.
struct Session {
  ResolvedSpec spec;
  std::unique_ptr<core::PluginManager> plugins;
};

Session open_session(const Args& args) {
  Session s;
  s.spec = read_spec(args);
  if (!s.spec.spec.contains("model"))
    throw core::SpecError("/model", "missing: training needs a model node {\"impl\": NAME, ...}");
  s.spec.uses = core::resolve_spec(s.spec.spec, *s.spec.catalog);
  const nlohmann::json& log = s.spec.spec["log"];
  LogLevel level;
  if (core::parse_log_level(log["level"].get<std::string>(), &level)) core::set_log_level(level);
  s.plugins = std::make_unique<core::PluginManager>(std::move(*s.spec.catalog),
                                                    s.spec.spec["plugins"]["options"],
                                                    s.spec.spec["train"]["seed"].get<uint64_t>());
  load_plugins_for(s.spec, *s.plugins);
  return s;
}

void print_layout(const Session& s, const fs::path& run_dir) {
  const nlohmann::json& par = s.spec.spec["parallel"];
  int64_t world = par["tp"].get<int64_t>() * par["cp"].get<int64_t>() * par["dp"].get<int64_t>() *
                  par["pp"].get<int64_t>();
  std::printf("  run dir: %s\n  layout: tp=%d cp=%d ep=%d dp=%d pp=%d (world size %lld)\n",
              run_dir.string().c_str(), par["tp"].get<int>(), par["cp"].get<int>(),
              par["ep"].get<int>(), par["dp"].get<int>(), par["pp"].get<int>(),
              static_cast<long long>(world));
  for (const core::LoadedPlugin& p : s.plugins->loaded())
    std::printf("  plugin %s %s (%s)\n", p.record->name.c_str(), p.info->version,
                p.record->library.string().c_str());
}

void require_single_process(const nlohmann::json& spec) {
  const nlohmann::json& par = spec["parallel"];
  for (const char* dim : {"tp", "cp", "ep", "dp", "pp"})
    if (par[dim].get<int64_t>() != 1)
      throw Error(Code::kUnimplemented,
                  fmt::format("spec /parallel/{}: {} needs several processes, which this loom "
                              "cannot start yet; set it to 1",
                              dim, par[dim].get<int64_t>()));
}

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom train SPEC [--set PATH=VALUE]... [--run-dir DIR] [--plugin-path DIR]";
  Args args = parse_args(argv, {{}, {"--set", "--run-dir", "--plugin-path"}, 1, 1, usage});
  Session s = open_session(args);
  require_single_process(s.spec.spec);

  // The run directory holds the resolved spec (defaults filled in) and metrics.
  const nlohmann::json& log = s.spec.spec["log"];
  fs::path run_dir = args.get("--run-dir");
  if (run_dir.empty())
    run_dir = log.contains("run_dir") ? fs::path(log["run_dir"].get<std::string>())
                                      : fs::path("runs") / s.spec.path.stem();
  s.spec.spec["log"]["run_dir"] = run_dir.string();
  core::write_json_atomically(s.spec.spec, run_dir / "spec.resolved.json");

  std::printf("loom train %s\n", s.spec.path.string().c_str());
  print_layout(s, run_dir);
  core::Trainer trainer(s.spec.spec, *s.plugins);
  trainer.print_banner(stdout);
  core::RunOptions options;
  options.run_dir = run_dir;
  auto t0 = std::chrono::steady_clock::now();
  trainer.run(options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("done: %lld steps in %.1f s; metrics in %s\n",
              static_cast<long long>(trainer.iteration()), seconds,
              (run_dir / "metrics.jsonl").string().c_str());
  return core::kExitOk;
}

int cmd_bench(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom bench SPEC [--steps N] [--warmup N] [--set PATH=VALUE]... [--plugin-path DIR] [--json]";
  Args args = parse_args(
      argv, {{"--json"}, {"--set", "--steps", "--warmup", "--plugin-path"}, 1, 1, usage});
  int64_t steps = args.integer("--steps", 10);
  int64_t warmup = args.integer("--warmup", 2);
  if (steps < 1) throw core::UsageError("--steps must be at least 1 (" + usage + ")");
  Session s = open_session(args);
  require_single_process(s.spec.spec);
  // Benchmarks measure compute: synthetic tokens, no evaluation, no files.
  s.spec.spec["data"] = {{"mock", true}, {"split", "949,50,1"}};
  bool json = args.flag("--json");
  core::Trainer trainer(s.spec.spec, *s.plugins);
  if (!json) {
    std::printf("loom bench %s\n", s.spec.path.string().c_str());
    trainer.print_banner(stdout);
  }
  for (int64_t i = 0; i < warmup; ++i) trainer.step();
  std::vector<double> times;
  int64_t tokens = 0;
  double loss = 0;
  for (int64_t i = 0; i < steps; ++i) {
    core::StepResult r = trainer.step();
    times.push_back(r.seconds);
    tokens = r.tokens;
    loss = r.loss;
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double t : times) mean += t;
  mean /= static_cast<double>(times.size());
  double median = sorted[sorted.size() / 2];
  double tps = static_cast<double>(tokens) / mean;
  double mfu =
      trainer.peak_flops() > 0 ? trainer.flops_per_step() / mean / trainer.peak_flops() : 0;
  uint64_t peak = s.plugins->host().cpu_memory().peak;
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
                          {"last_loss", loss}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "bench: %lld timed steps after %lld warm-up | %.0f tok/s | %.1f ms/step (median %.1f) | "
        "MFU %.1f%% of %.1f GFLOP/s | achieved %.1f GFLOP/s | peak mem %.1f MiB\n",
        static_cast<long long>(steps), static_cast<long long>(warmup), tps, 1e3 * mean,
        1e3 * median, 100 * mfu, trainer.peak_flops() / 1e9, trainer.flops_per_step() / mean / 1e9,
        static_cast<double>(peak) / (1 << 20));
  }
  return core::kExitOk;
}

}  // namespace loom::cli
