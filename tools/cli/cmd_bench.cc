// loom bench SPEC [--nproc N] [--steps N] [--warmup N] [--set ...] [--json]: warm-up plus
// timed steps on synthetic tokens; prints tokens/s, ms/step, MFU and peak memory (and the
// memory estimate beside it).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include <filesystem>

#include "core/train/session.h"
#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "tools/cli/commands.h"

namespace loom::cli {

int cmd_bench(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom bench SPEC [--nproc N] [--steps N] [--warmup N] [--set PATH=VALUE]... [--plugin-path "
      "DIR] [--trace DIR] [--json]";
  Args args = parse_args(
      argv,
      {{"--json"}, {"--set", "--steps", "--warmup", "--plugin-path", "--nproc", "--trace"}, 1, 1,
       usage});
  if (!args.get("--nproc").empty())
    return relaunch_self(nproc_of(args), without_nproc("bench", argv));
  int64_t steps = args.integer("--steps", 10);
  int64_t warmup = args.integer("--warmup", 2);
  if (steps < 1) throw core::UsageError("--steps must be at least 1 (" + usage + ")");
  const std::string spec_path = args.positionals.at(0);
  std::unique_ptr<core::RunSession> s = open_run_session(args);
  const std::string trace_dir = args.get("--trace");
  if (!trace_dir.empty() && s->config().parallel.pp == 1)
    throw core::UsageError(
        "--trace writes a pipeline's actions (pipeline_trace.json); this run has parallel.pp 1");
  // Benchmarks measure compute: synthetic tokens, no evaluation, no files.
  s->set_data({{"mock", true}, {"split", "949,50,1"}});
  bool json = args.flag("--json");
  core::Trainer trainer(s->spec(), s->plugins(), nullptr, nlohmann::json::object(), s->parallel());
  if (!json) {
    std::printf("loom bench %s\n", spec_path.c_str());
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
  // A pipeline's traced steps (2 to 1 + log.trace_steps: warm-up and timed alike), on
  // request: every rank takes part, rank 0 writes.
  if (!trace_dir.empty()) {
    std::filesystem::create_directories(trace_dir);
    trainer.write_trace(trace_dir);
  }
  double tps = static_cast<double>(tokens) / mean;
  double mfu =
      trainer.peak_flops() > 0 ? trainer.flops_per_step() / mean / trainer.peak_flops() : 0;
  uint64_t peak = trainer.peak_memory();
  core::MemoryEstimate estimate = trainer.memory_estimate();
  if (json) {
    nlohmann::json out = {{"spec", spec_path},
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
                          // This rank's parts of the estimate, in bytes: the persistent ones
                          // as allocated (master and optimizer: this rank's shards under
                          // the distributed optimizer), activations by formula (null when
                          // the model cannot size them).
                          {"estimated_mem_parts",
                           {{"weights", estimate.weights},
                            {"grads", estimate.grads},
                            {"master", estimate.master},
                            {"optimizer", estimate.optimizer},
                            {"fp8", estimate.fp8},
                            {"shard_buffers", estimate.shard_buffers},
                            {"activations", estimate.activations
                                                ? nlohmann::json(*estimate.activations)
                                                : nlohmann::json(nullptr)}}},
                          {"world_size", s->env().world_size},
                          {"comm_share", comm_share},
                          {"last_loss", loss}};
    std::printf("%s\n", out.dump(2).c_str());
    return core::kExitOk;
  }
  std::printf(
      "bench: %lld timed steps after %lld warm-up | %.0f tok/s | %.1f ms/step (median %.1f) | "
      "MFU %.1f%% of %.1f GFLOP/s | achieved %.1f GFLOP/s | peak mem %.1f MiB%s\n",
      static_cast<long long>(steps), static_cast<long long>(warmup), tps, 1e3 * mean, 1e3 * median,
      100 * mfu, trainer.peak_flops() / 1e9, trainer.flops_per_step() / mean / 1e9,
      static_cast<double>(peak) / (1 << 20),
      s->env().distributed()
          ? fmt::format(" | {} ranks, {:.1f}% of the step blocked in communication (rank 0)",
                        s->env().world_size, 100 * comm_share)
                .c_str()
          : "");
  if (estimate.activations)
    std::printf("bench: peak memory %.1f MiB is %+.1f%% of the analytic estimate, %s\n",
                static_cast<double>(peak) / (1 << 20),
                100.0 * (static_cast<double>(peak) / static_cast<double>(estimate.total()) - 1),
                estimate.describe().c_str());
  return core::kExitOk;
}

}  // namespace loom::cli
