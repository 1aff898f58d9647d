// `loom launch`: starts the ranks of one machine, like torchrun --standalone, and stops
// them together when one fails or the user interrupts.
#pragma once

#include <string>
#include <vector>

namespace loom::core::launch {

/// What to start.
struct LaunchOptions {
  int nproc = 1;      ///< ranks on this machine (>= 1)
  int nnodes = 1;     ///< machines in the run, each running its own launcher
  int node_rank = 0;  ///< this machine, in [0, nnodes)
  /// Rendezvous address (open_store): a directory on a shared file system or
  /// redis://HOST:PORT. Empty: a fresh temporary directory, removed at the end (only for
  /// nnodes == 1).
  std::string rdzv;
  /// Key prefix shared by all ranks. Empty: LOOM_RUN_ID when set, else random hex (only for
  /// nnodes == 1: the launchers of several machines must agree on it).
  std::string run_id;
  std::vector<std::string> command;  ///< the program (searched on PATH) and its arguments
  double kill_grace_s = 10;          ///< SIGTERM to SIGKILL when stopping ranks
};

/// Runs `options.command` as ranks node_rank * nproc ... + nproc - 1 of nnodes * nproc, each
/// in its own process group with LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK,
/// LOOM_LOCAL_WORLD_SIZE, LOOM_NODE_RANK, LOOM_NNODES, LOOM_RDZV and LOOM_RUN_ID set. Their
/// output lines come out prefixed "[rank R] " (stdout to stdout, stderr to stderr).
///
/// When a rank exits non-zero or dies by a signal, one line on stderr names it, the others
/// get SIGTERM and, kill_grace_s later, SIGKILL. SIGINT or SIGTERM to the launcher is
/// forwarded to every rank (they save a checkpoint and exit); a second one kills them.
///
/// Returns 0 when every rank exits 0; else the first failure's exit code (128 + signal for
/// a rank killed by a signal), or 130 when a second interrupt killed the ranks.
/// Throws core::UsageError for bad options and IoError when a process or the rendezvous
/// directory cannot be created.
int launch(const LaunchOptions& options);

}  // namespace loom::core::launch
