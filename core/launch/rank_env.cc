#include "core/launch/rank_env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/errors.h"

namespace loom::core::launch {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int parse_int(const char* name, const std::string& text, int min) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw UsageError(fmt::format("environment variable {}='{}' is not an integer", name, text));
  if (value < min)
    throw UsageError(fmt::format("environment variable {}={} must be >= {}", name, value, min));
  return value;
}

// An integer variable that must be present (the launcher that set its siblings always
// sets it).
int required_int(const char* name, const char* launcher, int min) {
  std::optional<std::string> text = env(name);
  if (!text)
    throw UsageError(fmt::format(
        "environment variable {} is not set, but the other {} rank "
        "variables are; start the ranks with {}",
        name, launcher, std::string_view(launcher) == "loom" ? "`loom launch`" : launcher));
  return parse_int(name, *text, min);
}

int optional_int(const char* name, int fallback, int min) {
  std::optional<std::string> text = env(name);
  return text ? parse_int(name, *text, min) : fallback;
}

// "value must be below bound" checks name both variables.
void check_below(const char* name, int value, const char* bound_name, int bound) {
  if (value >= bound)
    throw UsageError(fmt::format("environment variable {}={} must be less than {}={}", name, value,
                                 bound_name, bound));
}

// The number of tasks on node `node` from SLURM_TASKS_PER_NODE, e.g. "2(x3),1": two tasks
// on each of the first three nodes, then one.
int slurm_tasks_on_node(const std::string& text, int node) {
  const char* name = "SLURM_TASKS_PER_NODE";
  auto bad = [&] {
    return UsageError(
        fmt::format("environment variable {}='{}' is not a list like '2(x3),1'", name, text));
  };
  if (text.empty()) throw bad();
  // The whole list is checked, not only the entries before this node's.
  std::vector<std::pair<int, int>> entries;  // (tasks, nodes)
  size_t pos = 0;
  for (;;) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int tasks = 0, repeat = 1;
    size_t paren = item.find('(');
    std::string count = item.substr(0, paren);
    auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), tasks);
    if (count.empty() || ec != std::errc() || end != count.data() + count.size() || tasks < 1)
      throw bad();
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
        throw bad();
      std::string times = item.substr(paren + 2, item.size() - paren - 3);
      auto [end2, ec2] = std::from_chars(times.data(), times.data() + times.size(), repeat);
      if (ec2 != std::errc() || end2 != times.data() + times.size() || repeat < 1) throw bad();
    }
    entries.emplace_back(tasks, repeat);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  int first = 0;
  for (const auto& [tasks, nodes] : entries) {
    if (node < first + nodes) return tasks;
    first += nodes;
  }
  throw UsageError(
      fmt::format("environment variable {}='{}' lists {} nodes, but SLURM_NODEID "
                  "is {}",
                  name, text, first, node));
}

void require_rdzv(const RankEnv& env_out) {
  if (env_out.distributed() && env_out.rdzv.empty())
    throw UsageError(fmt::format(
        "{} ranks started by {} need a rendezvous: set LOOM_RDZV to a directory on a shared "
        "file system (every rank can write it) or to redis://HOST:PORT",
        env_out.world_size, env_out.launcher));
}

void check_ranges(const RankEnv& e, const char* rank, const char* world, const char* local,
                  const char* local_world, const char* node, const char* nnodes) {
  check_below(rank, e.rank, world, e.world_size);
  check_below(local, e.local_rank, local_world, e.local_world_size);
  check_below(node, e.node_rank, nnodes, e.nnodes);
  if (e.local_world_size > e.world_size)
    throw UsageError(fmt::format("environment variable {}={} must not exceed {}={}", local_world,
                                 e.local_world_size, world, e.world_size));
}

}  // namespace

RankEnv detect_rank_env() {
  RankEnv e;
  e.rdzv = env("LOOM_RDZV").value_or("");
  std::optional<std::string> run_id = env("LOOM_RUN_ID");
  if (env("LOOM_RANK")) {
    e.launcher = "loom";
    e.rank = required_int("LOOM_RANK", "loom", 0);
    e.world_size = required_int("LOOM_WORLD_SIZE", "loom", 1);
    e.local_rank = optional_int("LOOM_LOCAL_RANK", e.rank, 0);
    e.local_world_size = optional_int("LOOM_LOCAL_WORLD_SIZE", e.world_size, 1);
    e.node_rank = optional_int("LOOM_NODE_RANK", 0, 0);
    e.nnodes = optional_int("LOOM_NNODES", 1, 1);
    e.run_id = run_id.value_or("loom");
    check_ranges(e, "LOOM_RANK", "LOOM_WORLD_SIZE", "LOOM_LOCAL_RANK", "LOOM_LOCAL_WORLD_SIZE",
                 "LOOM_NODE_RANK", "LOOM_NNODES");
    require_rdzv(e);
  } else if (env("SLURM_PROCID")) {
    e.launcher = "slurm";
    e.rank = required_int("SLURM_PROCID", "Slurm", 0);
    e.world_size = required_int("SLURM_NTASKS", "Slurm", 1);
    e.local_rank = optional_int("SLURM_LOCALID", 0, 0);
    e.node_rank = optional_int("SLURM_NODEID", 0, 0);
    e.nnodes = optional_int("SLURM_NNODES", 1, 1);
    if (std::optional<std::string> per_node = env("SLURM_NTASKS_PER_NODE"))
      e.local_world_size = parse_int("SLURM_NTASKS_PER_NODE", *per_node, 1);
    else if (std::optional<std::string> list = env("SLURM_TASKS_PER_NODE"))
      e.local_world_size = slurm_tasks_on_node(*list, e.node_rank);
    else
      e.local_world_size = e.nnodes == 1 ? e.world_size : 1;
    e.run_id = run_id ? *run_id
                      : fmt::format("slurm-{}.{}", env("SLURM_JOB_ID").value_or("0"),
                                    env("SLURM_STEP_ID").value_or("0"));
    check_ranges(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE",
                 "SLURM_NODEID", "SLURM_NNODES");
    require_rdzv(e);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    e.launcher = "mpirun";
    e.rank = required_int("OMPI_COMM_WORLD_RANK", "mpirun", 0);
    e.world_size = required_int("OMPI_COMM_WORLD_SIZE", "mpirun", 1);
    e.local_rank = optional_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
    e.local_world_size = optional_int("OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size, 1);
    // Open MPI does not export the node index; with the default by-slot mapping every node
    // holds the same number of ranks, so it follows from the rank.
    e.nnodes = (e.world_size + e.local_world_size - 1) / e.local_world_size;
    e.node_rank = e.rank / e.local_world_size;
    // Every rank of one mpirun shares its PMIx namespace ("prterun-host-1234@1").
    e.run_id =
        run_id ? *run_id
               : "mpirun-" +
                     env("PMIX_NAMESPACE").value_or(env("OMPI_MCA_ess_base_jobid").value_or("0"));
    check_ranges(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "(node)", "(nnodes)");
    require_rdzv(e);
  } else {
    e.launcher = "single";
    e.run_id = run_id.value_or("single");
  }
  return e;
}

}  // namespace loom::core::launch
