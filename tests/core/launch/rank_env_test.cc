// detect_rank_env: the variables of `loom launch`, Slurm and mpirun, and a message naming
// the variable for every malformed value.
#include "core/launch/rank_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "core/util/errors.h"

using ::testing::HasSubstr;

namespace loom::core::launch {
namespace {

// Clears every variable detect_rank_env reads, then sets `vars`.
void set_env(const std::map<std::string, std::string>& vars) {
  for (const char* name : {"LOOM_RANK",
                           "LOOM_WORLD_SIZE",
                           "LOOM_LOCAL_RANK",
                           "LOOM_LOCAL_WORLD_SIZE",
                           "LOOM_NODE_RANK",
                           "LOOM_NNODES",
                           "LOOM_RDZV",
                           "LOOM_RUN_ID",
                           "SLURM_PROCID",
                           "SLURM_NTASKS",
                           "SLURM_LOCALID",
                           "SLURM_NTASKS_PER_NODE",
                           "SLURM_TASKS_PER_NODE",
                           "SLURM_NODEID",
                           "SLURM_NNODES",
                           "SLURM_JOB_ID",
                           "SLURM_STEP_ID",
                           "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                           "PMIX_NAMESPACE",
                           "OMPI_MCA_ess_base_jobid"})
    unsetenv(name);
  for (const auto& [name, value] : vars) setenv(name.c_str(), value.c_str(), 1);
}

// detect_rank_env must throw UsageError whose message contains `part`.
void expect_error(const std::map<std::string, std::string>& vars, const std::string& part) {
  set_env(vars);
  try {
    detect_rank_env();
    ADD_FAILURE() << "accepted; expected an error with: " << part;
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

TEST(RankEnv, SingleProcessWhenNothingIsSet) {
  set_env({});
  RankEnv e = detect_rank_env();
  EXPECT_EQ(e.launcher, "single");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_FALSE(e.distributed());
}

TEST(RankEnv, LoomLaunch) {
  set_env({{"LOOM_RANK", "5"},
           {"LOOM_WORLD_SIZE", "8"},
           {"LOOM_LOCAL_RANK", "1"},
           {"LOOM_LOCAL_WORLD_SIZE", "4"},
           {"LOOM_NODE_RANK", "1"},
           {"LOOM_NNODES", "2"},
           {"LOOM_RDZV", "/shared/rdzv"},
           {"LOOM_RUN_ID", "abc"},
           // loom launch wins over the scheduler that started the launcher
           {"SLURM_PROCID", "0"},
           {"SLURM_NTASKS", "2"}});
  RankEnv e = detect_rank_env();
  EXPECT_EQ(e.launcher, "loom");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.rdzv, "/shared/rdzv");
  EXPECT_EQ(e.run_id, "abc");
  EXPECT_TRUE(e.distributed());
}

TEST(RankEnv, Slurm) {
  set_env({{"SLURM_PROCID", "5"},
           {"SLURM_NTASKS", "7"},
           {"SLURM_LOCALID", "0"},
           {"SLURM_TASKS_PER_NODE", "2(x2),3"},
           {"SLURM_NODEID", "2"},
           {"SLURM_NNODES", "3"},
           {"SLURM_JOB_ID", "4242"},
           {"SLURM_STEP_ID", "1"},
           {"LOOM_RDZV", "redis://head:6379"}});
  RankEnv e = detect_rank_env();
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 7);
  EXPECT_EQ(e.local_world_size, 3);  // the third entry of "2(x2),3"
  EXPECT_EQ(e.node_rank, 2);
  EXPECT_EQ(e.nnodes, 3);
  EXPECT_EQ(e.run_id, "slurm-4242.1");
  EXPECT_EQ(e.rdzv, "redis://head:6379");

  setenv("SLURM_NTASKS_PER_NODE", "4", 1);  // preferred over the list when present
  setenv("SLURM_NTASKS", "12", 1);
  setenv("LOOM_RUN_ID", "mine", 1);
  e = detect_rank_env();
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.run_id, "mine");
}

TEST(RankEnv, OpenMpi) {
  set_env({{"OMPI_COMM_WORLD_RANK", "3"},
           {"OMPI_COMM_WORLD_SIZE", "4"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
           {"PMIX_NAMESPACE", "prterun-host-77@1"},
           {"LOOM_RDZV", "/nfs/rdzv"}});
  RankEnv e = detect_rank_env();
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.run_id, "mpirun-prterun-host-77@1");
  EXPECT_EQ(e.rdzv, "/nfs/rdzv");
}

TEST(RankEnv, OneRankNeedsNoRendezvous) {
  set_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(detect_rank_env().launcher, "slurm");
  set_env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  EXPECT_FALSE(detect_rank_env().distributed());
}

TEST(RankEnv, MissingRendezvous) {
  const std::string fix =
      "set LOOM_RDZV to a directory on a shared file system (every rank can write it) or to "
      "redis://HOST:PORT";
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, "2 ranks started by slurm");
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, fix);
  expect_error({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, fix);
  expect_error({{"LOOM_RANK", "1"}, {"LOOM_WORLD_SIZE", "2"}}, fix);
}

TEST(RankEnv, MalformedValuesNameTheVariable) {
  const std::map<std::string, std::string> rdzv = {{"LOOM_RDZV", "/r"}};
  auto with = [&](std::map<std::string, std::string> vars) {
    vars.insert(rdzv.begin(), rdzv.end());
    return vars;
  };
  expect_error(with({{"LOOM_RANK", "x"}, {"LOOM_WORLD_SIZE", "2"}}),
               "environment variable LOOM_RANK='x' is not an integer");
  expect_error(with({{"LOOM_RANK", "1 "}, {"LOOM_WORLD_SIZE", "2"}}), "LOOM_RANK='1 '");
  expect_error(with({{"LOOM_RANK", ""}, {"LOOM_WORLD_SIZE", "2"}}), "LOOM_RANK=''");
  expect_error(with({{"LOOM_RANK", "99999999999"}, {"LOOM_WORLD_SIZE", "2"}}),
               "LOOM_RANK='99999999999' is not an integer");
  expect_error(with({{"LOOM_RANK", "-1"}, {"LOOM_WORLD_SIZE", "2"}}), "LOOM_RANK=-1 must be >= 0");
  expect_error(with({{"LOOM_RANK", "2"}, {"LOOM_WORLD_SIZE", "2"}}),
               "LOOM_RANK=2 must be less than LOOM_WORLD_SIZE=2");
  expect_error(with({{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "0"}}),
               "LOOM_WORLD_SIZE=0 must be >= 1");
  expect_error(with({{"LOOM_RANK", "0"}}), "LOOM_WORLD_SIZE is not set");
  expect_error(with({{"LOOM_RANK", "0"},
                     {"LOOM_WORLD_SIZE", "4"},
                     {"LOOM_LOCAL_RANK", "2"},
                     {"LOOM_LOCAL_WORLD_SIZE", "2"}}),
               "LOOM_LOCAL_RANK=2 must be less than LOOM_LOCAL_WORLD_SIZE=2");
  expect_error(with({{"LOOM_RANK", "0"},
                     {"LOOM_WORLD_SIZE", "4"},
                     {"LOOM_NODE_RANK", "2"},
                     {"LOOM_NNODES", "2"}}),
               "LOOM_NODE_RANK=2 must be less than LOOM_NNODES=2");
  expect_error(with({{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "2"}, {"LOOM_LOCAL_WORLD_SIZE", "3"}}),
               "LOOM_LOCAL_WORLD_SIZE=3 must not exceed LOOM_WORLD_SIZE=2");

  expect_error(with({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
               "SLURM_PROCID=4 must be less than SLURM_NTASKS=4");
  expect_error(with({{"SLURM_PROCID", "0"}}), "SLURM_NTASKS is not set");
  expect_error(with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "four"}}),
               "SLURM_NTASKS='four' is not an integer");
  expect_error(with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "0"}}),
               "SLURM_NTASKS_PER_NODE=0 must be >= 1");
  for (const char* list : {"2(x", "x", "2(y3)", "2(x0)", "", "2,,1", "0"})
    expect_error(with({{"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "4"},
                       {"SLURM_NNODES", "2"},
                       {"SLURM_TASKS_PER_NODE", list}}),
                 "SLURM_TASKS_PER_NODE='" + std::string(list) + "' is not a list like '2(x3),1'");
  expect_error(with({{"SLURM_PROCID", "3"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_NNODES", "3"},
                     {"SLURM_NODEID", "2"},
                     {"SLURM_TASKS_PER_NODE", "2(x2)"}}),
               "SLURM_TASKS_PER_NODE='2(x2)' lists 2 nodes, but SLURM_NODEID is 2");
  expect_error(with({{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_NODEID", "1"},
                     {"SLURM_NNODES", "1"}}),
               "SLURM_NODEID=1 must be less than SLURM_NNODES=1");

  expect_error(with({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "1"}}),
               "OMPI_COMM_WORLD_RANK=1 must be less than OMPI_COMM_WORLD_SIZE=1");
  expect_error(with({{"OMPI_COMM_WORLD_RANK", "0"}}), "OMPI_COMM_WORLD_SIZE is not set");
  expect_error(with({{"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "z"}}),
               "OMPI_COMM_WORLD_LOCAL_RANK='z' is not an integer");
  expect_error(with({{"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}}),
               "OMPI_COMM_WORLD_LOCAL_RANK=1 must be less than OMPI_COMM_WORLD_LOCAL_SIZE=1");
}

}  // namespace
}  // namespace loom::core::launch
