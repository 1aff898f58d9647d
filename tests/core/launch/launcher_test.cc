// launch(): prefixed output, the rank environment, one failure stopping every rank, exit
// codes for signals, forwarded interrupts and stray grandchildren.
#include "core/launch/launcher.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/util/errors.h"

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

namespace loom::core::launch {
namespace {

fs::path test_dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? fs::path(tmp) : fs::temp_directory_path();
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// A launcher running in a child process with its stdout and stderr in files, so the test
// sees exactly what a user's terminal would.
struct Launched {
  pid_t pid = -1;
  fs::path out, err;

  static Launched start(const LaunchOptions& options) {
    static int counter = 0;
    Launched l;
    fs::path base =
        test_dir() / ("launch_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    l.out = base.string() + ".out";
    l.err = base.string() + ".err";
    l.pid = fork();
    if (l.pid == 0) {
      int out = open(l.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open(l.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
      int code = 100;
      try {
        code = launch(options);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "exception: %s\n", e.what());
      }
      _exit(code);
    }
    return l;
  }
  // Exit code of the launcher (-1 when it did not exit normally).
  int wait() const {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Waits until stdout contains `text` `times` times (false after 10 s).
  bool wait_for_output(const std::string& text, int times) const {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      std::string all = slurp(out);
      int found = 0;
      for (size_t at = all.find(text); at != std::string::npos; at = all.find(text, at + 1))
        ++found;
      if (found >= times) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

LaunchOptions sh(int nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc = nproc;
  o.command = {"/bin/sh", "-c", script};
  return o;
}

TEST(Launch, RanksGetTheirEnvironmentAndPrefixedOutput) {
  Launched l =
      Launched::start(sh(3,
                         "echo \"rank=$LOOM_RANK world=$LOOM_WORLD_SIZE local=$LOOM_LOCAL_RANK/"
                         "$LOOM_LOCAL_WORLD_SIZE node=$LOOM_NODE_RANK/$LOOM_NNODES\"; "
                         "echo \"to stderr $LOOM_RANK\" >&2; printf 'no newline'"));
  EXPECT_EQ(l.wait(), 0);
  EXPECT_THAT(sorted_lines(slurp(l.out)),
              ElementsAre("[rank 0] no newline", "[rank 0] rank=0 world=3 local=0/3 node=0/1",
                          "[rank 1] no newline", "[rank 1] rank=1 world=3 local=1/3 node=0/1",
                          "[rank 2] no newline", "[rank 2] rank=2 world=3 local=2/3 node=0/1"));
  EXPECT_THAT(sorted_lines(slurp(l.err)),
              ElementsAre("[rank 0] to stderr 0", "[rank 1] to stderr 1", "[rank 2] to stderr 2"));
  // Each rank's lines stay in its order.
  std::string out = slurp(l.out);
  EXPECT_LT(out.find("[rank 1] rank=1"), out.find("[rank 1] no newline"));
}

TEST(Launch, NodeRankOffsetsGlobalRanks) {
  LaunchOptions o = sh(2, "echo $LOOM_RANK/$LOOM_WORLD_SIZE $LOOM_NODE_RANK $LOOM_RUN_ID");
  o.nnodes = 3;
  o.node_rank = 2;
  o.rdzv = (test_dir() / "rdzv_nodes").string();
  o.run_id = "job7";
  Launched l = Launched::start(o);
  EXPECT_EQ(l.wait(), 0);
  EXPECT_THAT(sorted_lines(slurp(l.out)),
              ElementsAre("[rank 4] 4/6 2 job7", "[rank 5] 5/6 2 job7"));
}

TEST(Launch, TemporaryRendezvousIsSharedThenRemoved) {
  Launched l = Launched::start(sh(2, "echo $LOOM_RDZV $LOOM_RUN_ID"));
  EXPECT_EQ(l.wait(), 0);
  std::vector<std::string> lines = sorted_lines(slurp(l.out));
  ASSERT_EQ(lines.size(), 2u);
  std::string rest0 = lines[0].substr(9), rest1 = lines[1].substr(9);  // after "[rank R] "
  EXPECT_EQ(rest0, rest1);
  std::string dir = rest0.substr(0, rest0.find(' '));
  std::string run_id = rest0.substr(rest0.find(' ') + 1);
  EXPECT_THAT(dir, HasSubstr("loom-rdzv-"));
  EXPECT_EQ(run_id.size(), 16u);
  EXPECT_FALSE(fs::exists(dir)) << "the temporary rendezvous directory was left behind";
}

TEST(Launch, OneFailureStopsTheOthers) {
  auto start = std::chrono::steady_clock::now();
  Launched l =
      Launched::start(sh(3, "if [ $LOOM_RANK = 1 ]; then echo dying >&2; exit 3; fi; sleep 60"));
  EXPECT_EQ(l.wait(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(slurp(l.err),
            "[rank 1] dying\nloom launch: rank 1 exited with code 3; stopping the other ranks\n");
}

TEST(Launch, RanksIgnoringSigtermAreKilledAfterTheGrace) {
  LaunchOptions o = sh(2,
                       "if [ $LOOM_RANK = 0 ]; then sleep 0.2; exit 5; fi; "
                       "trap '' TERM; sleep 60");
  o.kill_grace_s = 0.5;
  auto start = std::chrono::steady_clock::now();
  Launched l = Launched::start(o);
  EXPECT_EQ(l.wait(), 5);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Launch, KilledRankGives128PlusSignal) {
  Launched l = Launched::start(sh(1, "kill -9 $$"));
  EXPECT_EQ(l.wait(), 137);
  EXPECT_EQ(slurp(l.err), "loom launch: rank 0 was killed by signal 9 (SIGKILL)\n");
}

TEST(Launch, CommandThatCannotRun) {
  LaunchOptions o;
  o.command = {"/nonexistent/loom-test-binary"};
  Launched l = Launched::start(o);
  EXPECT_EQ(l.wait(), 127);
  EXPECT_THAT(slurp(l.err), HasSubstr("[rank 0] loom launch: cannot run "
                                      "'/nonexistent/loom-test-binary': No such file"));
}

TEST(Launch, SigtermIsForwardedAndRanksExitCleanly) {
  Launched l = Launched::start(
      sh(2, "trap 'echo saved; exit 0' TERM; echo ready; while :; do sleep 0.05; done"));
  ASSERT_TRUE(l.wait_for_output("ready", 2)) << slurp(l.err);
  kill(l.pid, SIGTERM);
  EXPECT_EQ(l.wait(), 0);
  EXPECT_THAT(sorted_lines(slurp(l.out)),
              ElementsAre("[rank 0] ready", "[rank 0] saved", "[rank 1] ready", "[rank 1] saved"));
  EXPECT_THAT(slurp(l.err), HasSubstr("loom launch: got SIGTERM; passing it to the ranks"));
}

TEST(Launch, SecondInterruptKills) {
  Launched l = Launched::start(
      sh(2, "trap 'echo still here' INT; echo ready; while :; do sleep 0.05; done"));
  ASSERT_TRUE(l.wait_for_output("ready", 2)) << slurp(l.err);
  kill(l.pid, SIGINT);
  ASSERT_TRUE(l.wait_for_output("still here", 2));
  kill(l.pid, SIGINT);
  EXPECT_EQ(l.wait(), 130);
}

TEST(Launch, StrayGrandchildDoesNotKeepTheLauncher) {
  auto start = std::chrono::steady_clock::now();
  Launched l = Launched::start(sh(1, "sleep 60 & echo started"));
  EXPECT_EQ(l.wait(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(slurp(l.out), "[rank 0] started\n");
}

TEST(Launch, BadOptionsAreUsageErrors) {
  LaunchOptions o = sh(0, "true");
  EXPECT_THROW(launch(o), UsageError);
  o = sh(1, "true");
  o.nnodes = 2;
  EXPECT_THROW(launch(o), UsageError);  // no --rdzv
  o.rdzv = (test_dir() / "rdzv_bad").string();
  unsetenv("LOOM_RUN_ID");
  try {
    launch(o);
    FAIL() << "multi-node without a run id";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("pass --run-id ID"));
  }
  o.node_rank = 2;
  EXPECT_THROW(launch(o), UsageError);
  o = LaunchOptions{};
  EXPECT_THROW(launch(o), UsageError);  // no command
}

}  // namespace
}  // namespace loom::core::launch
