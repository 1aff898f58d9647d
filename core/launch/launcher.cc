#include "core/launch/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include "core/launch/store.h"
#include "core/util/errors.h"

extern char** environ;

namespace fs = std::filesystem;

namespace loom::core::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Signals reach the poll loop through this pipe (the handler only writes one byte), so the
// loop sleeps in poll() and still reacts at once to an interrupt or a rank's exit.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int signal) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signal);
  ssize_t ignored = ::write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

// Installs the launcher's handlers and puts the previous ones back when it ends, so that a
// caller (`loom train --nproc`) keeps its own handling afterwards.
class SignalScope {
 public:
  SignalScope() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw IoError(fmt::format("loom launch: cannot create a pipe: {}", std::strerror(errno)));
    struct sigaction action = {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (int i = 0; i < 3; ++i) ::sigaction(kHandled[i], &action, &previous_[i]);
    // A closed stdout (`loom launch ... | head`) must not kill the launcher and orphan the
    // ranks; writes then fail and the output is dropped.
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &previous_pipe_);
  }
  ~SignalScope() {
    for (int i = 0; i < 3; ++i) ::sigaction(kHandled[i], &previous_[i], nullptr);
    ::sigaction(SIGPIPE, &previous_pipe_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  static constexpr int kHandled[3] = {SIGINT, SIGTERM, SIGCHLD};
  struct sigaction previous_[3];
  struct sigaction previous_pipe_;
};

void write_fully(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stdout closed: the ranks' output is dropped, they keep running
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// One output pipe of a rank, re-emitted line by line with the rank's prefix.
struct Stream {
  int fd = -1;          // read end, non-blocking; -1 once closed
  int out_fd = 1;       // where its lines go
  std::string pending;  // bytes after the last newline
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
};

// A line longer than this is emitted in pieces, so a rank printing without newlines
// (progress bars) cannot grow the launcher's memory without bound.
constexpr size_t kMaxLine = 1 << 16;

void emit_lines(const Rank& rank, Stream& stream, bool at_end) {
  const std::string prefix = fmt::format("[rank {}] ", rank.rank);
  size_t start = 0;
  std::string text;
  for (;;) {
    size_t newline = stream.pending.find('\n', start);
    if (newline == std::string::npos) break;
    text += prefix;
    text.append(stream.pending, start, newline + 1 - start);
    start = newline + 1;
  }
  stream.pending.erase(0, start);
  if (!stream.pending.empty() && (at_end || stream.pending.size() >= kMaxLine)) {
    text += prefix + stream.pending + "\n";
    stream.pending.clear();
  }
  if (!text.empty()) write_fully(stream.out_fd, text.data(), text.size());
}

// Reads what the pipe holds now; at end of file flushes a partial last line and closes it.
void drain(const Rank& rank, Stream& stream) {
  char buffer[1 << 15];
  while (stream.fd >= 0) {
    ssize_t n = ::read(stream.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      emit_lines(rank, stream, /*at_end=*/true);
      ::close(stream.fd);
      stream.fd = -1;
      return;
    }
    stream.pending.append(buffer, static_cast<size_t>(n));
    emit_lines(rank, stream, /*at_end=*/false);
  }
}

std::string random_hex() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}", device(), device());
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  int signal = WTERMSIG(status);
  const char* name = sigabbrev_np(signal);
  return fmt::format("was killed by signal {} (SIG{})", signal, name != nullptr ? name : "?");
}

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void signal_ranks(std::vector<Rank>& ranks, int signal) {
  for (Rank& r : ranks)
    if (r.running) ::kill(-r.pid, signal);  // the whole group: grandchildren too
}

void validate(const LaunchOptions& o) {
  if (o.nproc < 1)
    throw UsageError(fmt::format("--nproc {}: needs at least 1 rank per machine", o.nproc));
  if (o.nnodes < 1) throw UsageError(fmt::format("--nnodes {}: needs at least 1", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw UsageError(fmt::format("--node-rank {}: must be in [0, {}) for --nnodes {}", o.node_rank,
                                 o.nnodes, o.nnodes));
  if (o.command.empty())
    throw UsageError(
        "nothing to run: put the command after --, e.g. "
        "`loom launch --nproc 2 -- loom train spec.json`");
  if (o.nnodes > 1 && o.rdzv.empty())
    throw UsageError(fmt::format(
        "--nnodes {} needs --rdzv: a directory on a file system every machine shares, or "
        "redis://HOST:PORT",
        o.nnodes));
  if (o.kill_grace_s < 0)
    throw UsageError(fmt::format("--kill-grace {}: must be >= 0 seconds", o.kill_grace_s));
}

// The environment of rank `rank`: ours, with the LOOM_* rank variables replaced.
std::vector<std::string> rank_environment(
    const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    bool replaced = false;
    for (const auto& [name, value] : set)
      if (entry.size() > name.size() && entry.substr(0, name.size()) == name &&
          entry[name.size()] == '=')
        replaced = true;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

// Forks and execs one rank with its stdout and stderr on fresh pipes.
void start_rank(Rank& rank, const std::vector<std::string>& command,
                const std::vector<std::string>& environment) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0)
    throw IoError(fmt::format("loom launch: pipe: {}", std::strerror(errno)));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    int error = errno;
    ::close(out[0]);
    ::close(out[1]);
    throw IoError(fmt::format("loom launch: pipe: {}", std::strerror(error)));
  }
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<char*> argv, envp;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::string exec_failed = fmt::format("loom launch: cannot run '{}': ", command[0]);

  // Signals stay blocked from fork until the child has reset its handlers: the child
  // inherits the launcher's handler and signal pipe, and a SIGTERM sent to its group in
  // between would otherwise look to the launcher as if the launcher itself got it.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    int error = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw IoError(fmt::format("loom launch: cannot start rank {}: fork: {}", rank.rank,
                              std::strerror(error)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    struct sigaction fallback = {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::sigaction(s, &fallback, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execvpe(argv[0], argv.data(), envp.data());
    int error = errno;
    write_fully(2, exec_failed.data(), exec_failed.size());
    const char* reason = ::strerror(error);
    write_fully(2, reason, ::strlen(reason));
    write_fully(2, "\n", 1);
    ::_exit(127);
  }
  // Also here: whichever of parent and child runs first, the group exists before the
  // launcher may signal it.
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  rank.pid = pid;
  rank.running = true;
  rank.out = Stream{out[0], 1, {}};
  rank.err = Stream{err[0], 2, {}};
}

// Removes the temporary rendezvous directory however launch() ends.
struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ignored;
    if (!path.empty()) fs::remove_all(path, ignored);
  }
};

}  // namespace

int launch(const LaunchOptions& options) {
  validate(options);
  std::string run_id = options.run_id;
  if (run_id.empty()) {
    const char* from_env = std::getenv("LOOM_RUN_ID");
    if (from_env != nullptr && *from_env != '\0')
      run_id = from_env;
    else if (options.nnodes > 1)
      throw UsageError(fmt::format(
          "--nnodes {}: the launchers of all machines must share a run id; pass --run-id ID "
          "(the same on every machine, e.g. the job id) or set LOOM_RUN_ID",
          options.nnodes));
    else
      run_id = random_hex();
  }

  TempDir temp;
  std::string rdzv = options.rdzv;
  if (rdzv.empty()) {
    const char* tmpdir = std::getenv("TMPDIR");
    std::string pattern =
        (fs::path(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") / "loom-rdzv-XXXXXX")
            .string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw IoError(
          fmt::format("loom launch: cannot create a rendezvous directory {}: {}; set "
                      "TMPDIR to a writable directory or pass --rdzv DIR",
                      pattern, std::strerror(errno)));
    temp.path = pattern;
    rdzv = pattern;
  }
  // Opening the store here reports an unwritable directory or an unreachable Redis server
  // once, before any rank starts.
  open_store(rdzv, run_id);

  const int world_size = options.nnodes * options.nproc;
  std::vector<Rank> ranks(static_cast<size_t>(options.nproc));
  SignalScope signals;
  try {
    for (int local = 0; local < options.nproc; ++local) {
      Rank& rank = ranks[static_cast<size_t>(local)];
      rank.rank = options.node_rank * options.nproc + local;
      std::vector<std::string> environment = rank_environment({
          {"LOOM_RANK", std::to_string(rank.rank)},
          {"LOOM_WORLD_SIZE", std::to_string(world_size)},
          {"LOOM_LOCAL_RANK", std::to_string(local)},
          {"LOOM_LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
          {"LOOM_NODE_RANK", std::to_string(options.node_rank)},
          {"LOOM_NNODES", std::to_string(options.nnodes)},
          {"LOOM_RDZV", rdzv},
          {"LOOM_RUN_ID", run_id},
      });
      start_rank(rank, options.command, environment);
    }
  } catch (...) {
    signal_ranks(ranks, SIGKILL);
    for (Rank& r : ranks) {
      if (r.running) ::waitpid(r.pid, nullptr, 0);
      for (int fd : {r.out.fd, r.err.fd})
        if (fd >= 0) ::close(fd);
    }
    throw;
  }

  std::optional<int> first_failure;
  int interrupts = 0;
  std::optional<Clock::time_point> kill_at;   // SIGKILL the ranks still running then
  std::optional<Clock::time_point> drain_by;  // stop waiting for stray writers then
  for (;;) {
    bool any_running = false, any_open = false;
    for (const Rank& r : ranks) {
      any_running |= r.running;
      any_open |= r.out.fd >= 0 || r.err.fd >= 0;
    }
    if (!any_running && !drain_by) {
      // Every rank has exited: a grandchild still holding a pipe is a stray; end it.
      for (const Rank& r : ranks) ::kill(-r.pid, SIGKILL);
      drain_by = Clock::now() + std::chrono::seconds(2);
    }
    if (!any_running && (!any_open || Clock::now() >= *drain_by)) break;

    std::vector<pollfd> fds = {{g_signal_pipe[0], POLLIN, 0}};
    for (const Rank& r : ranks)
      for (const Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0});
    int timeout_ms = 100;  // also bounds a lost SIGCHLD
    if (kill_at) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, timeout_ms));
    }
    ::poll(fds.data(), fds.size(), timeout_ms);

    unsigned char received[64];
    ssize_t n;
    while ((n = ::read(g_signal_pipe[0], received, sizeof received)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        int signal = received[i];
        if (signal != SIGINT && signal != SIGTERM) continue;
        ++interrupts;
        if (interrupts == 1) {
          std::fprintf(stderr,
                       "loom launch: got SIG%s; passing it to the ranks (again to kill them)\n",
                       sigabbrev_np(signal));
          signal_ranks(ranks, signal);
        } else {
          signal_ranks(ranks, SIGKILL);
        }
      }
    }
    for (Rank& r : ranks) {
      drain(r, r.out);
      drain(r, r.err);
    }
    for (Rank& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      if (done != r.pid) continue;
      r.running = false;
      // Its last words (an error message) come before the launcher's line about it.
      drain(r, r.out);
      drain(r, r.err);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      if (first_failure || interrupts >= 2) continue;
      first_failure = exit_code_of(status);
      bool others = false;
      for (const Rank& o : ranks) others |= o.running;
      std::fprintf(stderr, "loom launch: rank %d %s%s\n", r.rank, describe_exit(status).c_str(),
                   others ? "; stopping the other ranks" : "");
      if (others) {
        signal_ranks(ranks, SIGTERM);
        kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(options.kill_grace_s));
      }
    }
    if (kill_at && Clock::now() >= *kill_at) {
      signal_ranks(ranks, SIGKILL);
      kill_at.reset();
    }
  }
  for (Rank& r : ranks)
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        emit_lines(r, *s, /*at_end=*/true);
        ::close(s->fd);
        s->fd = -1;
      }
  if (first_failure) return *first_failure;
  return interrupts >= 2 ? 130 : 0;
}

}  // namespace loom::core::launch
