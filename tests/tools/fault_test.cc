// The fault matrix with real processes (issue "Reliability II"): faults injected on purpose
// (LOOM_TEST_FAULT, core/train/test_fault.h; LOOM_CHECKPOINT_FAULT,
// core/checkpoint/checkpoint_writer.h) and what a user must see.
//  - Result validation (/train/rerun_mode validate_results, Megatron's rerun state
//    machine): a NaN in a gradient or a loss spike that does not reproduce is a transient
//    fault, the step goes on with its rerun and the run ends exactly as an unfaulted one; a
//    reproducible one is reported as such and a NaN step is skipped; without validation a
//    NaN step is skipped and the non-finite limit stops the run.
//  - A straggler (one rank slowed) is named in the log.
//  - A rank killed in the middle of a tensor-parallel step, or in the middle of a save:
//    the other stops within the timeout naming it; the newest complete checkpoint verifies
//    and resumes to the unfaulted run's losses.
//  - A full disk (a file-size limit) during a save: one message, no `latest`, nothing
//    partial left.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::fresh_dir;
using testing::read_file;
using testing::run_loom;
using testing::write_file;

nlohmann::json tiny_spec() {
  return nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "vocab_size": 64, "max_position_embeddings": 32,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "lr_schedule": {"impl": "cosine", "warmup_steps": 2},
    "data": {"mock": true},
    "train": {"steps": 6, "micro_batch_size": 2, "global_batch_size": 4, "seq_length": 16,
              "log_interval": 1, "eval_interval": 100, "eval_steps": 1, "grad_clip": 1.0},
    "checkpoint": {"save_at_end": false}
  })");
}

// What metrics.jsonl says: the losses and norms of the log lines (null: NaN), the number
// of skipped steps, and the rerun lines.
struct Metrics {
  std::vector<double> loss, grad_norm;
  int64_t skipped = 0;
  std::vector<nlohmann::json> reruns;
};

Metrics read_metrics(const fs::path& file) {
  Metrics m;
  std::stringstream lines(read_file(file));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("rerun")) {
      m.reruns.push_back(j);
    } else if (j.contains("grad_norm")) {
      m.loss.push_back(j["loss"].is_null() ? std::nan("") : j["loss"].get<double>());
      m.grad_norm.push_back(j["grad_norm"].is_null() ? std::nan("")
                                                     : j["grad_norm"].get<double>());
      m.skipped += j["skipped"].get<int64_t>();
    }
  }
  return m;
}

// Equal to the bit: a step run again after a transient fault computes what the unfaulted
// step computes, on one process and on several.
void expect_identical(const Metrics& a, const Metrics& b, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size()) << what;
  for (size_t i = 0; i < a.loss.size(); ++i) {
    EXPECT_EQ(a.loss[i], b.loss[i]) << what << ": loss at step " << i + 1;
    EXPECT_EQ(a.grad_norm[i], b.grad_norm[i]) << what << ": grad norm at step " << i + 1;
  }
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_dir("fault_test"); }
  testing::WithoutLeakCheck no_leak_scan_;  // multi-rank processes (parallel_test.cc says why)

  static std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
  fs::path spec(const std::string& name, const nlohmann::json& body) {
    fs::path p = dir_ / (name + ".json");
    write_file(p, body.dump(2));
    return p;
  }
  // `loom train` of `body` into run dir `name` with `args` and the environment `env`.
  testing::RunResult train(const std::string& name, const nlohmann::json& body,
                           const std::string& args = "", const std::string& env = "") {
    testing::RunResult r =
        run_loom("train " + q(spec(name, body)) + " --run-dir " + q(dir_ / name) + " " + args, env);
    std::printf("--- %s (exit %d)\n%s%s", name.c_str(), r.exit_code, r.out.c_str(), r.err.c_str());
    return r;
  }
  Metrics metrics(const std::string& name) { return read_metrics(dir_ / name / "metrics.jsonl"); }

  fs::path dir_;
};

nlohmann::json validating(nlohmann::json s) {
  s["train"]["rerun_mode"] = "validate_results";
  return s;
}

// A NaN in one gradient element in the first run of step 3 only: the rerun differs, the
// fault is called transient, and the run ends bit for bit as the unfaulted one.
TEST_F(FaultTest, TransientNanInAGradientIsRerunAndLeavesNoTrace) {
  ASSERT_EQ(train("clean", tiny_spec()).exit_code, 0);
  auto r = train("nan", validating(tiny_spec()), "", "LOOM_TEST_FAULT=nan:0:3");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("LOOM_TEST_FAULT: nan rank 0 at step 3"));
  EXPECT_THAT(r.out, HasSubstr("step 3 run again (non-finite gradients; loss "));
  EXPECT_THAT(r.out, HasSubstr("not reproduced"));
  EXPECT_THAT(r.out, HasSubstr("a transient fault"));
  Metrics clean = metrics("clean"), nan = metrics("nan");
  ASSERT_EQ(nan.reruns.size(), 1u);
  EXPECT_EQ(nan.reruns[0]["step"], 3);
  EXPECT_EQ(nan.reruns[0]["rerun"], "transient");
  EXPECT_TRUE(nan.reruns[0]["first_grad_norm"].is_null());  // the NaN the first run saw
  EXPECT_EQ(nan.skipped, 0);
  expect_identical(clean, nan, "a transient NaN, rerun");
  // The same fault without validation: the step is skipped and the run differs from then on.
  auto plain = train("nan_plain", tiny_spec(), "", "LOOM_TEST_FAULT=nan:0:3");
  ASSERT_EQ(plain.exit_code, 0);
  EXPECT_THAT(plain.out, HasSubstr("step 3 skipped: non-finite gradients"));
  EXPECT_THAT(plain.out, Not(HasSubstr("run again")));
  Metrics skipped = metrics("nan_plain");
  EXPECT_EQ(skipped.skipped, 1);
  EXPECT_EQ(skipped.loss[1], clean.loss[1]);
  EXPECT_NE(skipped.loss[3], clean.loss[3]) << "step 3's update was skipped";
}

// A NaN in every run of step 3: reproduced exactly, reported as not transient, and the step
// is skipped; with /train/max_nonfinite_steps 1 the run stops there with a message.
TEST_F(FaultTest, ReproducibleNanIsReportedSkippedAndLimited) {
  auto r = train("nan_always", validating(tiny_spec()), "", "LOOM_TEST_FAULT=nan_always:0:3");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("step 3 run again (non-finite gradients"));
  EXPECT_THAT(r.out, HasSubstr("reproduced exactly: the data or the model"));
  EXPECT_THAT(r.out, HasSubstr("step 3 skipped: non-finite gradients"));
  Metrics m = metrics("nan_always");
  ASSERT_EQ(m.reruns.size(), 1u);
  EXPECT_EQ(m.reruns[0]["rerun"], "reproducible");
  EXPECT_EQ(m.skipped, 1);

  nlohmann::json limited = validating(tiny_spec());
  limited["train"]["max_nonfinite_steps"] = 1;
  auto stop = train("nan_limit", limited, "", "LOOM_TEST_FAULT=nan_always:0:3");
  EXPECT_EQ(stop.exit_code, 6);
  EXPECT_THAT(stop.err, HasSubstr("step 3: the loss or gradients were non-finite 1 steps in a row "
                                  "(limit /train/max_nonfinite_steps = 1)"));
}

// A loss spike (1000 added to the loss of step 5) after 3 calibration steps: a transient one
// is rerun and the run ends as the unfaulted one; a reproducible one is reported and kept.
TEST_F(FaultTest, LossSpikesAreRerunAndJudged) {
  nlohmann::json s = validating(tiny_spec());
  s["train"]["check_for_spiky_loss"] = true;
  s["train"]["spiky_loss_samples"] = 3;
  ASSERT_EQ(train("clean", tiny_spec()).exit_code, 0);
  auto r = train("spike", s, "", "LOOM_TEST_FAULT=spike:0:5");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("step 5 run again (spiky loss "));
  EXPECT_THAT(r.out, HasSubstr(">= 10 x "));
  EXPECT_THAT(r.out, HasSubstr("the largest of the first 3 steps"));
  EXPECT_THAT(r.out, HasSubstr("a transient fault"));
  Metrics clean = metrics("clean"), spike = metrics("spike");
  ASSERT_EQ(spike.reruns.size(), 1u);
  EXPECT_EQ(spike.reruns[0]["rerun"], "transient");
  EXPECT_GT(spike.reruns[0]["first_loss"].get<double>(), 1000.0);
  expect_identical(clean, spike, "a transient loss spike, rerun");

  auto again = train("spike_always", s, "", "LOOM_TEST_FAULT=spike_always:0:5");
  ASSERT_EQ(again.exit_code, 0);
  EXPECT_THAT(again.out, HasSubstr("reproduced exactly"));
  Metrics kept = metrics("spike_always");
  ASSERT_EQ(kept.reruns.size(), 1u);
  EXPECT_EQ(kept.reruns[0]["rerun"], "reproducible");
  EXPECT_GT(kept.loss[4], 1000.0);
  // Before the calibration ends nothing is judged spiky: the same spike at step 2 is not rerun.
  auto early = train("spike_early", s, "", "LOOM_TEST_FAULT=spike:0:2");
  ASSERT_EQ(early.exit_code, 0);
  EXPECT_THAT(early.out, Not(HasSubstr("run again")));
  // A spike check without reruns is refused before start.
  nlohmann::json bad = tiny_spec();
  bad["train"]["check_for_spiky_loss"] = true;
  auto refused = train("spike_refused", bad);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("/train/check_for_spiky_loss"));
  EXPECT_THAT(refused.err, HasSubstr("validate_results"));
}

// Data parallelism without the distributed optimizer: each rank computes the gradient
// norm of its own copy of the reduced gradients, and a transient NaN written into rank 1's
// copy after the reduction is seen by rank 1 alone. The ranks agree to rerun (else they
// would part ways and time out), rank 0's log names rank 1, and the run ends as the
// unfaulted two-rank run.
TEST_F(FaultTest, TransientNanOnOneRankIsRerunByAll) {
  const std::string dp2 = "--nproc 2 --set parallel.dp=2 --set parallel.timeout_s=60";
  ASSERT_EQ(train("dp2_clean", tiny_spec(), dp2).exit_code, 0);
  auto r = train("dp2_nan", validating(tiny_spec()), dp2, "LOOM_TEST_FAULT=nan:1:2");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("LOOM_TEST_FAULT: nan rank 1 at step 2"));
  EXPECT_THAT(r.out, HasSubstr("step 2 run again (rank 1: non-finite gradients; loss "));
  EXPECT_THAT(r.out, HasSubstr("a transient fault"));
  expect_identical(metrics("dp2_clean"), metrics("dp2_nan"), "dp2, a transient NaN on rank 1");
}

// A straggler: rank 1 sleeps 300 ms in every step; the log names it.
TEST_F(FaultTest, AStragglerIsNamed) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 3;
  s["train"]["log_interval"] = 3;
  auto r = train("slow", s, "--nproc 2 --set parallel.dp=2", "LOOM_TEST_FAULT=slow:1:300");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("straggler: rank 1 computes "));
  EXPECT_THAT(r.out, HasSubstr("x rank 0's"));
  std::string first = read_file(dir_ / "slow" / "metrics.jsonl");
  nlohmann::json line = nlohmann::json::parse(first.substr(0, first.find('\n')));
  EXPECT_EQ(line["slowest_rank"], 1);
  EXPECT_GT(line["compute_ms_slowest"].get<double>(), 300.0);
  EXPECT_LT(line["compute_ms_fastest"].get<double>(), line["compute_ms_slowest"].get<double>() - 250);
}

// Two ranks started without the launcher, rank 1 under LOOM_TEST_FAULT / LOOM_CHECKPOINT_FAULT
// (`env`): returns each rank's exit code and stderr, and the seconds both took.
struct TwoRanks {
  int code0 = 0, code1 = 0;
  std::string err0, err1;
  double seconds = 0;
};

class FaultTestTwoRanks : public FaultTest {
 protected:
  TwoRanks two_ranks(const std::string& name, const nlohmann::json& body, const std::string& args,
                     const std::string& env) {
    fs::path sp = spec(name, body);
    std::vector<testing::Background> ranks;
    auto t0 = std::chrono::steady_clock::now();
    for (int rank = 0; rank < 2; ++rank)
      ranks.push_back(testing::start_loom(
          "train " + q(sp) + " --run-dir " + q(dir_ / name) + " " + args,
          "LOOM_RANK=" + std::to_string(rank) + " LOOM_WORLD_SIZE=2 LOOM_RDZV=" +
              q(dir_ / ("rdzv_" + name)) + " LOOM_RUN_ID=" + name + " " + env));
    TwoRanks out;
    out.code1 = testing::wait_loom(ranks[1]);
    out.code0 = testing::wait_loom(ranks[0]);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.err0 = read_file(ranks[0].err);
    out.err1 = read_file(ranks[1].err);
    std::printf("--- %s after %.1f s\n  rank 0 (exit %d): %s  rank 1 (exit %d): %s", name.c_str(),
                out.seconds, out.code0, out.err0.c_str(), out.code1, out.err1.c_str());
    return out;
  }
};

// Tensor parallelism: rank 1 killed in the middle of step 3 (the other waits in a
// collective of the forward or backward pass): rank 0 stops, naming the group and rank 1.
TEST_F(FaultTestTwoRanks, ATensorParallelRankKilledMidStepStopsTheOther) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 50;
  TwoRanks r = two_ranks("tp_die", s, "--set parallel.tp=2 --set parallel.timeout_s=60",
                         "LOOM_TEST_FAULT=kill:1:3");
  EXPECT_EQ(r.code1, -SIGKILL);
  EXPECT_EQ(r.code0, 6) << r.err0;
  EXPECT_THAT(r.err0, HasSubstr("group 'tp/0'")) << r.err0;
  EXPECT_THAT(r.err0, HasSubstr("rank 1 closed the connection")) << r.err0;
  EXPECT_LT(r.seconds, 60.0);
}

// Saving every 2 steps, rank 1 is killed after writing its part of step 4's checkpoint, in
// each layout (data parallelism with the distributed optimizer, tensor parallelism,
// pipeline parallelism). Rank 0 stops naming it; `latest` still names step 2's checkpoint,
// which verifies, and a run resumed from it continues with the unfaulted run's losses.
TEST_F(FaultTestTwoRanks, ARankKilledMidSaveLeavesTheLastCheckpointGood) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 6;
  for (const auto& [name, layout] : std::vector<std::pair<std::string, std::string>>{
           {"dp2zero", "--set parallel.dp=2 --set parallel.distributed_optimizer=true"},
           {"tp2", "--set parallel.tp=2"},
           {"pp2", "--set parallel.pp=2"}}) {
    SCOPED_TRACE(name);
    auto whole = train(name + "_whole", s, "--nproc 2 " + layout);
    ASSERT_EQ(whole.exit_code, 0);
    fs::path ckpts = dir_ / (name + "_ckpts");
    TwoRanks r = two_ranks(name + "_save_die", s,
                           layout + " --set parallel.timeout_s=60 --set checkpoint.interval=2 "
                                    "--set checkpoint.dir=" + q(ckpts),
                           "LOOM_CHECKPOINT_FAULT=part:4:1");
    EXPECT_EQ(r.code1, -SIGKILL);
    EXPECT_NE(r.code0, 0);
    EXPECT_THAT(r.err0, HasSubstr("rank 1 closed the connection")) << r.err0;
    EXPECT_LT(r.seconds, 60.0);
    EXPECT_EQ(read_file(ckpts / "latest"), "iter_0000002\n");
    EXPECT_FALSE(fs::exists(ckpts / "iter_0000004"));
    auto verify = run_loom("checkpoint inspect --verify " + q(ckpts / "iter_0000002"));
    EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
    auto resumed = train(name + "_resumed", s,
                         "--nproc 2 " + layout + " --set checkpoint.dir=" + q(ckpts) +
                             " --set checkpoint.resume=\"auto\"");
    ASSERT_EQ(resumed.exit_code, 0);
    EXPECT_THAT(resumed.out, HasSubstr("resume: iteration 2"));
    Metrics all = metrics(name + "_whole"), rest = metrics(name + "_resumed");
    ASSERT_EQ(rest.loss.size(), 4u);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_NEAR(rest.loss[i], all.loss[i + 2], 1e-6 * all.loss[i + 2]) << "step " << i + 3;
  }
}

// A full disk during a save (a 200 KiB file-size limit, below the checkpoint's size): the
// run fails with one message naming the checkpoint, leaves no `latest` and no partial
// directory; the log written before stays whole.
TEST_F(FaultTest, AFullDiskDuringASaveFailsCleanly) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 4;
  s["checkpoint"] = {{"interval", 2}, {"save_at_end", true}};
  fs::path ckpts = dir_ / "full" / "checkpoints";
  auto r = train("full", s, "", "sh -c 'ulimit -f 200 && exec \"$0\" \"$@\"'");
  EXPECT_EQ(r.exit_code, 5) << "an I/O error";
  EXPECT_THAT(r.err, HasSubstr("error: checkpoint "));
  EXPECT_THAT(r.err, HasSubstr("iter_0000002"));
  EXPECT_THAT(r.err, HasSubstr("write failed: File too large"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one message";
  EXPECT_FALSE(fs::exists(ckpts / "latest"));
  if (fs::exists(ckpts))
    for (const auto& entry : fs::directory_iterator(ckpts))
      ADD_FAILURE() << "left behind: " << entry.path();
  Metrics m = metrics("full");
  EXPECT_EQ(m.loss.size(), 2u);
}

}  // namespace
}  // namespace loom
