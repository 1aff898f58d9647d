// loom schedule show --pp P [--vpp V] --micro-batches M [--schedule NAME] [--group G]
//
// A pipeline schedule's plan for every rank, run against each other in the core's plan
// simulator (core/train/plan_simulator.h) without training anything: a per-rank diagram in
// time units of one forward (a backward takes two; zb_h1's halves one each), the simulated
// bubble beside the theory, and the most micro-batches each rank keeps in flight.
#include <fmt/format.h>

#include <cstdio>

#include "core/component/builder.h"
#include "core/train/plan_simulator.h"
#include "core/util/errors.h"
#include "loom/kinds.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

constexpr const char* kShowUsage =
    "loom schedule show --pp P [--vpp V] --micro-batches M [--schedule NAME] [--group G] "
    "[--plugin-path DIR]";

int show(const std::vector<std::string>& argv) {
  Args args = parse_args(
      argv, {{}, {"--pp", "--vpp", "--micro-batches", "--schedule", "--group", "--plugin-path"},
             0, 0, kShowUsage});
  const int64_t pp = args.integer("--pp", -1, 1, 1024);
  const int64_t vpp = args.integer("--vpp", 1, 1, 64);
  const int64_t m = args.integer("--micro-batches", -1, 1, 100000);
  if (pp < 0 || m < 0)
    throw core::UsageError(fmt::format("--pp and --micro-batches are required ({})", kShowUsage));
  const std::string name = args.get("--schedule", vpp > 1 ? "interleaved" : "1f1b");
  nlohmann::json node = {{"impl", name}};
  if (!args.get("--group").empty()) node["microbatch_group_size"] = args.integer("--group", 0, 1);

  // The schedule as a run builds it: its plugin found and loaded, its options checked.
  nlohmann::json spec = {{"parallel", {{"pipeline_schedule", node}}}};
  auto catalog = std::make_unique<core::Catalog>(catalog_from_args(args));
  std::vector<core::ImplUse> uses = core::resolve_spec(spec, *catalog);
  core::PluginManager plugins(std::move(*catalog));
  core::load_plugins_for(spec, uses, plugins);
  ObjectPtr object =
      core::build_component(plugins, spec["parallel"]["pipeline_schedule"],
                            kinds::kPipelineSchedule, "/parallel/pipeline_schedule", {});
  auto* schedule = interface_cast<IPipelineSchedule>(object.get());

  std::vector<std::vector<PipelineAction>> plans;
  for (int32_t r = 0; r < pp; ++r) {
    PipelineShape shape{sizeof(PipelineShape), static_cast<int32_t>(pp), r,
                        static_cast<int32_t>(m), static_cast<int32_t>(vpp)};
    int64_t count = 0;
    throw_if_error(schedule->plan(&shape, nullptr, &count),
                   fmt::format("pipeline schedule '{}' (rank {})", name, r));
    std::vector<PipelineAction> plan(static_cast<size_t>(count));
    throw_if_error(schedule->plan(&shape, plan.data(), &count),
                   fmt::format("pipeline schedule '{}' (rank {})", name, r));
    plan.resize(static_cast<size_t>(count));
    plans.push_back(std::move(plan));
  }
  core::Simulation sim = core::simulate_plans(plans, static_cast<int32_t>(m),
                                              static_cast<int32_t>(vpp), core::PassCosts{}, name);
  std::printf("schedule %s: %lld stages x %lld virtual chunks, %lld micro-batches per step\n",
              name.c_str(), static_cast<long long>(pp), static_cast<long long>(vpp),
              static_cast<long long>(m));
  std::printf("one column per forward of a chunk (F forward, B backward = 2 columns, b input "
              "gradient, W weight gradient; %s. idle)\n\n",
              vpp > 1 ? "a, b, ... the chunk; " : "");
  std::fputs(core::draw_timeline(sim, static_cast<int32_t>(pp), 1.0).c_str(), stdout);
  double theory =
      core::theoretical_bubble(name, static_cast<int32_t>(pp), static_cast<int32_t>(m),
                               static_cast<int32_t>(vpp));
  std::printf("\nbubble: %.1f%% of the step simulated", 100 * sim.bubble());
  if (theory >= 0) std::printf(", %.1f%% in theory", 100 * theory);
  std::printf(" (span %.0f columns)\n", sim.span);
  std::string peaks;
  for (size_t r = 0; r < sim.peak_in_flight.size(); ++r)
    peaks += fmt::format("{}{}", r ? ", " : "", sim.peak_in_flight[r]);
  std::printf("micro-batches in flight at most, by rank: %s\n", peaks.c_str());
  return core::kExitOk;
}

}  // namespace

int cmd_schedule(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] != "show")
    throw core::UsageError(fmt::format("expected the subcommand show: {}", kShowUsage));
  return show({argv.begin() + 1, argv.end()});
}

}  // namespace loom::cli
