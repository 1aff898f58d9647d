// loom launch --nproc N [--nnodes M --node-rank R] [--rdzv DIR|redis://HOST:PORT]
//             [--run-id ID] [--kill-grace SECONDS] -- CMD [ARGS...]
// Starts N ranks of CMD on this machine (core/launch/launcher.h), like torchrun --standalone.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/launch/launcher.h"
#include "core/util/errors.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

constexpr const char* kUsage =
    "loom launch --nproc N [--nnodes M --node-rank R] [--rdzv DIR|redis://HOST:PORT] "
    "[--run-id ID] [--kill-grace SECONDS] -- CMD [ARGS...]";

}  // namespace

int cmd_launch(const std::vector<std::string>& argv) {
  // Everything after "--" belongs to the command, so its own options never meet our parser.
  auto dash = std::find(argv.begin(), argv.end(), "--");
  std::vector<std::string> ours(argv.begin(), dash);
  ArgSpec spec;
  spec.values = {"--nproc", "--nnodes", "--node-rank", "--rdzv", "--run-id", "--kill-grace"};
  spec.usage = kUsage;
  Args args = parse_args(ours, spec);

  core::launch::LaunchOptions options;
  if (args.get("--nproc").empty())
    throw core::UsageError(
        "--nproc is missing: say how many ranks to start on this machine, e.g. "
        "`loom launch --nproc 2 -- loom train spec.json`");
  options.nproc = static_cast<int>(args.integer("--nproc", 1, 1, 4096));
  options.nnodes = static_cast<int>(args.integer("--nnodes", 1, 1, 65536));
  options.node_rank = static_cast<int>(args.integer("--node-rank", 0, 0, 65535));
  if (options.node_rank >= options.nnodes)
    throw core::UsageError(
        fmt::format("--node-rank {} is out of range: with --nnodes {} it must "
                    "be in 0..{}",
                    options.node_rank, options.nnodes, options.nnodes - 1));
  if (options.nnodes > 1 && args.get("--rdzv").empty())
    throw core::UsageError(fmt::format(
        "--nnodes {} needs --rdzv: a directory on a file system every machine shares, or "
        "redis://HOST:PORT",
        options.nnodes));
  options.rdzv = args.get("--rdzv");
  options.run_id = args.get("--run-id");
  if (std::string grace = args.get("--kill-grace"); !grace.empty()) {
    char* end = nullptr;
    options.kill_grace_s = std::strtod(grace.c_str(), &end);
    if (end == grace.c_str() || *end != '\0' || !(options.kill_grace_s >= 0))
      throw core::UsageError(
          fmt::format("--kill-grace '{}': expected a number of seconds >= 0", grace));
  }
  if (dash == argv.end() || dash + 1 == argv.end())
    throw core::UsageError(
        "nothing to run: put the command after --, e.g. "
        "`loom launch --nproc 2 -- loom train spec.json`");
  options.command.assign(dash + 1, argv.end());
  return core::launch::launch(options);
}

int relaunch_self(int nproc, const std::vector<std::string>& argv_of_this_command) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw core::IoError(
        fmt::format("cannot find the loom binary through /proc/self/exe ({}); "
                    "start the ranks with `loom launch --nproc {} -- loom ...`",
                    ec.message(), nproc));
  core::launch::LaunchOptions options;
  options.nproc = nproc;
  options.command.push_back(self.string());
  options.command.insert(options.command.end(), argv_of_this_command.begin(),
                         argv_of_this_command.end());
  return core::launch::launch(options);
}

}  // namespace loom::cli
