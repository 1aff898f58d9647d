// `loom launch` through the real binary: usage errors are one line and exit 2; a run passes
// its ranks' output and exit code through.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/util/test_plugins.h"

using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace loom {
namespace {

using testing::run_loom;
using testing::RunResult;

constexpr int kUsage = 2;

// One line, "loom launch: error: ...", containing `part`.
void expect_usage_error(const std::string& args, const std::string& part) {
  RunResult r = run_loom(args);
  EXPECT_EQ(r.exit_code, kUsage) << args << "\n" << r.err;
  EXPECT_THAT(r.err, StartsWith("loom launch: error: ")) << args;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
  EXPECT_THAT(r.err, HasSubstr(part)) << args;
}

TEST(LaunchCli, UsageErrors) {
  expect_usage_error("launch -- true", "--nproc is missing");
  expect_usage_error("launch", "--nproc is missing");
  expect_usage_error("launch --nproc 0 -- true", "--nproc expects");
  expect_usage_error("launch --nproc two -- true", "--nproc expects");
  expect_usage_error("launch --nproc 2 --nnodes 2 -- true", "--nnodes 2 needs --rdzv");
  expect_usage_error("launch --nproc 2 --nnodes 2 --node-rank 2 --rdzv /tmp/x -- true",
                     "--node-rank 2 is out of range: with --nnodes 2 it must be in 0..1");
  expect_usage_error("launch --nproc 2", "nothing to run: put the command after --");
  expect_usage_error("launch --nproc 2 --", "nothing to run: put the command after --");
  expect_usage_error("launch --nproc 2 --kill-grace soon -- true", "--kill-grace 'soon'");
  expect_usage_error("launch --nproc 2 --rdzv redis://nohost:x -- true",
                     "expected redis://HOST:PORT");
}

TEST(LaunchCli, RunsRanksAndPassesTheExitCodeThrough) {
  RunResult r = run_loom("launch --nproc 2 -- /bin/sh -c 'echo hi $LOOM_RANK'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 0] hi 0\n"));
  EXPECT_THAT(r.out, HasSubstr("[rank 1] hi 1\n"));
  r = run_loom("launch --nproc 2 -- /bin/sh -c 'exit $((LOOM_RANK + 4))'");
  EXPECT_TRUE(r.exit_code == 4 || r.exit_code == 5) << r.exit_code;
  EXPECT_THAT(r.err, HasSubstr("loom launch: rank "));
  // The ranks' own options after -- are theirs, not the launcher's.
  r = run_loom("launch --nproc 1 -- /bin/echo --nproc 9 --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] --nproc 9 --help\n");
}

TEST(LaunchCli, HelpListsLaunch) {
  RunResult r = run_loom("--help");
  EXPECT_THAT(r.out, HasSubstr("launch --nproc N"));
}

}  // namespace
}  // namespace loom
