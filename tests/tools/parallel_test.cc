// Multi-process training on the CPU with real processes (DESIGN.md sections 5 and 9): one
// tiny spec trained on 1 rank and on 2 or 4 ranks with data, tensor and sequence
// parallelism and the distributed optimizer, with the gradient reduction overlapped with
// backward or not, gives the same loss and grad norm at every step and the same gradient
// of every parameter at step 1 (and with FP8, the same scales); a sharded checkpoint moves
// between layouts; SIGTERM stops every rank after the same step with one checkpoint; a dead
// or stuck rank stops the others with a message; ranks that loaded different plugins,
// resolved different specs or were given a layout that does not fit refuse to start.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "loom/cpp/safetensors.h"
#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::read_file;
using testing::run_loom;
using testing::write_file;

// f32 throughout, no dropout: the runs differ only in the order of floating-point sums
// (an average of two half-batch gradients instead of one accumulated batch).
constexpr double kLossTolerance = 2e-5;  // relative
constexpr double kNormTolerance = 1e-4;  // relative

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
    "train": {"steps": 6, "micro_batch_size": 2, "global_batch_size": 8, "seq_length": 16,
              "log_interval": 1, "eval_interval": 3, "eval_steps": 2, "grad_clip": 1.0},
    "checkpoint": {"save_at_end": false}
  })");
}

struct Curve {
  std::vector<double> loss, grad_norm, valid;
};

Curve read_curve(const fs::path& metrics) {
  Curve c;
  std::stringstream lines(read_file(metrics));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    nlohmann::json m = nlohmann::json::parse(line);
    if (m.contains("loss")) {
      c.loss.push_back(m["loss"].get<double>());
      c.grad_norm.push_back(m["grad_norm"].get<double>());
    }
    if (m.contains("valid_loss")) c.valid.push_back(m["valid_loss"].get<double>());
  }
  return c;
}

void expect_same_curve(const Curve& a, const Curve& b, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size()) << what;
  ASSERT_GE(a.loss.size(), 5u) << what;
  for (size_t i = 0; i < a.loss.size(); ++i) {
    EXPECT_NEAR(a.loss[i], b.loss[i], kLossTolerance * std::abs(a.loss[i]))
        << what << ": loss at step " << i + 1;
    EXPECT_NEAR(a.grad_norm[i], b.grad_norm[i], kNormTolerance * std::abs(a.grad_norm[i]))
        << what << ": grad norm at step " << i + 1;
  }
  ASSERT_EQ(a.valid.size(), b.valid.size()) << what;
  for (size_t i = 0; i < a.valid.size(); ++i)
    EXPECT_NEAR(a.valid[i], b.valid[i], kLossTolerance * std::abs(a.valid[i]))
        << what << ": validation loss " << i;
}

// The debug log's zero fill of each step of each rank (`lines` in all) spared the layers'
// weight gradients (their first write of the step overwrites them).
void expect_weight_grads_kept(const std::string& log, size_t lines) {
  std::regex line("step [0-9]+: zero fill of ([0-9]+) of ([0-9]+) gradient elements");
  size_t count = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it, ++count)
    EXPECT_LT(std::stoll((*it)[1].str()), std::stoll((*it)[2].str())) << it->str();
  EXPECT_EQ(count, lines) << log;
}

// The debug lines "step S: K of N gradient buckets handed to the reduction during
// backward": `lines` of them (every rank, every step), each with K == N > 1.
void expect_all_buckets_early(const std::string& log, size_t lines) {
  std::regex line(
      "step [0-9]+: ([0-9]+) of ([0-9]+) gradient buckets handed to the reduction "
      "during backward");
  size_t count = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it, ++count) {
    EXPECT_EQ((*it)[1].str(), (*it)[2].str()) << it->str();
    EXPECT_GT(std::stoi((*it)[2].str()), 1) << it->str();
  }
  EXPECT_EQ(count, lines) << log;
}

// Every tensor of a safetensors file, as f32.
std::map<std::string, std::vector<float>> read_tensors(const fs::path& file) {
  std::string bytes = read_file(file);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  SafetensorsLayout layout = parse_safetensors(data, bytes.size(), file);
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : layout.tensors) {
    EXPECT_EQ(t.dtype, DType::kF32) << name;
    std::vector<float> v((t.end - t.begin) / 4);
    std::memcpy(v.data(), data + layout.data_offset + t.begin, v.size() * 4);
    out[name] = std::move(v);
  }
  return out;
}

class ParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_dir("parallel_test"); }
  // Multi-rank processes (threads of Gloo and of the gradient reduction alive) crash
  // LeakSanitizer's tracer now and then (testing::WithoutLeakCheck says more).
  testing::WithoutLeakCheck no_leak_scan_;
  fs::path spec(const std::string& name, const nlohmann::json& body) {
    fs::path p = dir_ / name;
    write_file(p, body.dump(2));
    return p;
  }
  static std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
  // Resumes `body` from the checkpoints in `ckpts` (their latest pointing at step 3) with
  // `args` (the layout), into its own run dir, writing nothing; checks it resumed at step 3
  // and continued with `whole`'s losses and grad norms.
  void expect_resumes_like(const nlohmann::json& body, const fs::path& ckpts,
                           const std::string& name, const std::string& args, const Curve& whole) {
    write_file(ckpts / "latest", "iter_0000003\n");
    fs::path again = dir_ / ("resume_" + name);
    auto r = run_loom("train " + q(spec("resume_" + name + ".json", body)) + " --run-dir " +
                      q(again) + " " + args + " --set checkpoint.dir=" + q(ckpts) +
                      " --set checkpoint.resume=\"auto\" --set checkpoint.save_at_end=false "
                      "--set checkpoint.interval=1000");
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("resume: iteration 3")) << name;
    Curve rest = read_curve(again / "metrics.jsonl");
    ASSERT_EQ(rest.loss.size(), whole.loss.size() - 3) << name;
    for (size_t i = 0; i < rest.loss.size(); ++i) {
      EXPECT_NEAR(rest.loss[i], whole.loss[i + 3], kLossTolerance * whole.loss[i + 3])
          << name << ": loss at step " << i + 4;
      EXPECT_NEAR(rest.grad_norm[i], whole.grad_norm[i + 3],
                  kNormTolerance * whole.grad_norm[i + 3])
          << name << ": grad norm at step " << i + 4;
    }
  }
  // Two ranks of `loom train SPEC ARGS` started without the launcher (as srun or mpirun
  // start them), meeting in a rendezvous directory of their own, rank 1 with the fault
  // LOOM_TEST_FAULT=`fault` (both see it; it names the rank). Returns when rank 1 has ended
  // and rank 0 has, with the time from the start.
  struct TwoRanks {
    int code0 = 0, code1 = 0;
    std::string err0, err1;
    double seconds = 0;
  };
  TwoRanks two_ranks_with_a_fault(const std::string& name, const nlohmann::json& body,
                                  const std::string& args, const std::string& fault) {
    fs::path sp = spec(name + ".json", body);
    std::vector<testing::Background> ranks;
    auto t0 = std::chrono::steady_clock::now();
    for (int rank = 0; rank < 2; ++rank)
      ranks.push_back(testing::start_loom(
          "train " + q(sp) + " --run-dir " + q(dir_ / name) + " " + args,
          "LOOM_RANK=" + std::to_string(rank) + " LOOM_WORLD_SIZE=2 LOOM_RDZV=" +
              q(dir_ / ("rdzv_" + name)) + " LOOM_RUN_ID=" + name + " LOOM_TEST_FAULT=" + fault));
    TwoRanks out;
    out.code1 = testing::wait_loom(ranks[1]);
    out.code0 = testing::wait_loom(ranks[0]);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.err0 = read_file(ranks[0].err);
    out.err1 = read_file(ranks[1].err);
    return out;
  }
  // Rank 1 of a two-rank run of `body` with `layout` killed in the middle of step 3 (after
  // its first micro-batch's backward): rank 0 stops with a message naming `group` and the
  // dead rank, well within the timeout. Returns rank 0's message.
  std::string survivor_of_a_kill(const std::string& name, nlohmann::json body,
                                 const std::string& layout, const std::string& group) {
    body["train"]["steps"] = 50;
    body["checkpoint"] = {{"save_at_end", false}};
    TwoRanks r =
        two_ranks_with_a_fault(name, body, layout + " --set parallel.timeout_s=60", "kill:1:3");
    std::printf("%s: the surviving rank, after %.1f s: %s", name.c_str(), r.seconds,
                r.err0.c_str());
    EXPECT_EQ(r.code1, -SIGKILL) << name;
    EXPECT_EQ(r.code0, 6) << r.err0;  // training failed while running
    EXPECT_THAT(r.err0, HasSubstr("group '" + group + "'")) << r.err0;
    EXPECT_THAT(r.err0, HasSubstr("rank 1 closed the connection")) << r.err0;
    EXPECT_LT(r.seconds, 60.0) << r.err0;
    return r.err0;
  }
  // Trains `body` with `extra` arguments; returns the loss curve.
  Curve train(const std::string& name, const nlohmann::json& body, const std::string& extra,
              const std::string& env = "") {
    fs::path run = dir_ / name;
    auto r = run_loom(
        "train " + q(spec(name + ".json", body)) + " --run-dir " + q(run) + " " + extra, env);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.out << r.err;
    last_out_ = r.out;
    last_err_ = r.err;
    return read_curve(run / "metrics.jsonl");
  }
  // The weights after step 1 of run `name` (its first checkpoint, converted to whole
  // tensors).
  std::map<std::string, std::vector<float>> step_one(const std::string& name) {
    if (loom_names_) return step_one_by_loom_name(name);
    fs::path out = dir_ / (name + "_step1");
    if (fs::exists(out / "model.safetensors")) return read_tensors(out / "model.safetensors");
    auto r = run_loom("checkpoint convert " + q(dir_ / name / "checkpoints" / "iter_0000001") +
                      " " + q(out) + " --to safetensors");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return read_tensors(out / "model.safetensors");
  }
  // The same for a model Hugging Face has no counterpart of: its first checkpoint converted
  // to one rank's sharded files (whole tensors), read by loom's parameter names.
  // With bf16 parameters, the optimizer's f32 master copies ("optim.master.<name>") stand in
  // for the bf16 values.
  std::map<std::string, std::vector<float>> step_one_by_loom_name(const std::string& name) {
    std::map<std::string, std::vector<float>> all = step_one_checkpoint(name), tensors;
    for (auto& [n, v] : all)
      if (n.rfind("model.", 0) == 0) tensors[n.substr(6)] = v;
    for (auto& [n, v] : all)
      if (n.rfind("optim.master.", 0) == 0) tensors[n.substr(13)] = v;
    return tensors;
  }
  // Every tensor of run `name`'s first checkpoint converted to one rank's sharded files
  // (whole tensors, f32), by its name in the checkpoint ("model.", "optim.", "fp8.").
  std::map<std::string, std::vector<float>> step_one_checkpoint(const std::string& name) {
    fs::path out = dir_ / (name + "_step1_sharded");
    if (!fs::exists(out)) {
      auto r = run_loom("checkpoint convert " + q(dir_ / name / "checkpoints" / "iter_0000001") +
                        " " + q(out) + " --to sharded --dtype f32");
      EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    }
    fs::path shards = out / "iter_0000001" / "shards";
    nlohmann::json index = nlohmann::json::parse(read_file(shards / "rank_00000.json"));
    std::string bin = read_file(shards / "rank_00000.bin");
    std::map<std::string, std::vector<float>> tensors;
    for (const nlohmann::json& e : index["tensors"]) {
      std::string n = e["name"];
      EXPECT_EQ(e["dtype"], "f32") << n;
      EXPECT_EQ(e["shape"], e["global_shape"]) << n << ": one rank holds whole tensors";
      std::vector<float> v(e["nbytes"].get<size_t>() / 4);
      std::memcpy(v.data(), bin.data() + e["byte_offset"].get<size_t>(), v.size() * 4);
      tensors[n] = std::move(v);
    }
    return tensors;
  }
  bool loom_names_ = false;  // step_one reads loom's names (models HF cannot hold)
  // Per-parameter gradients of step 1: (reference - run) / lr elementwise, against the
  // grad norm of step 1 (the gradients' size).
  void expect_same_gradients(const std::string& reference, const std::string& run, double grad_norm,
                             double tolerance = kGradTolerance) {
    auto a = step_one(reference), b = step_one(run);
    ASSERT_EQ(a.size(), b.size()) << run;
    ASSERT_GT(a.size(), 10u);
    double worst = 0;
    std::string where;
    for (const auto& [name, va] : a) {
      ASSERT_TRUE(b.count(name)) << run << ": " << name;
      const std::vector<float>& vb = b.at(name);
      ASSERT_EQ(va.size(), vb.size()) << run << ": " << name;
      for (size_t i = 0; i < va.size(); ++i) {
        double d = std::abs(static_cast<double>(va[i]) - vb[i]) / 0.5;  // lr
        if (d > worst) worst = d, where = name;
      }
    }
    std::printf(
        "%s: per-parameter gradients of step 1 differ by at most %.3g (%s), grad norm "
        "%.3g\n",
        run.c_str(), worst, where.c_str(), grad_norm);
    EXPECT_LE(worst, tolerance * grad_norm) << run << ": " << where;
  }
  // Relative to the gradient's norm: f32 sums in another order.
  static constexpr double kGradTolerance = 1e-5;
  // bf16 parameters and activations: the same operations within a micro-batch, the
  // gradient sums (f32) in another order (f32 master weights compared). Achieved: 2.1e-7
  // of the grad norm at dp 2 with the distributed optimizer.
  static constexpr double kBf16GradTolerance = 1e-6;
  // FP8 matmuls: quantised with the same scales, the products summed in another order; e5m2
  // gradients near its subnormal range round differently when a rank's gradients are
  // scaled by another power of two (see the FP8 state in Fp8DataAndTensorParallel...).
  // Achieved: 2.3e-3 (dp2), 2.7e-3 (tp2), 1.3e-3 (cp2) of the grad norm.
  static constexpr double kFp8GradTolerance = 5e-3;
  // `body` as one step of plain SGD (lr 0.5, no momentum, constant rate, no clipping) with
  // a checkpoint after it: that checkpoint is the initial weights minus 0.5 times each
  // gradient (see pipeline_spec).
  static nlohmann::json one_sgd_step(nlohmann::json s) {
    s["optimizer"] = {{"impl", "sgd"}, {"lr", 0.5}, {"momentum", 0.0}};
    s["lr_schedule"] = {{"impl", "constant"}};
    s["train"]["grad_clip"] = 0.0;
    s["train"]["steps"] = 1;
    s["checkpoint"] = {{"interval", 1}, {"save_at_end", true}};
    return s;
  }
  // One SGD step of `body` on one rank (run once per `reference`) and with the layout
  // `args`: the same per-parameter gradients, within `tolerance` of the grad norm. The loss
  // curves compared elsewhere cannot see a gradient off by a constant factor (AdamW's step
  // does not depend on it).
  void expect_gradients_match_one_rank(const std::string& reference, const nlohmann::json& body,
                                       const std::string& name, const std::string& args,
                                       double tolerance = kGradTolerance,
                                       const std::string& env = "") {
    nlohmann::json s = one_sgd_step(body);
    loom_names_ = true;  // and the f32 master weights of bf16 parameters
    if (!fs::exists(dir_ / reference / "metrics.jsonl")) train(reference, s, "");
    Curve one = read_curve(dir_ / reference / "metrics.jsonl");
    ASSERT_EQ(one.grad_norm.size(), 1u) << reference;
    Curve c = train(name, s, args, env);
    ASSERT_EQ(c.loss.size(), 1u) << name;
    EXPECT_NEAR(c.loss[0], one.loss[0], kLossTolerance * one.loss[0]) << name;
    expect_same_gradients(reference, name, one.grad_norm[0], tolerance);
  }
  fs::path dir_;
  std::string last_out_, last_err_;
};

TEST_F(ParallelTest, DataParallelMatchesOneRank) {
  Curve one = train("one", tiny_spec(), "");
  Curve dp2 = train("dp2", tiny_spec(), "--nproc 2 --set parallel.dp=2");
  EXPECT_THAT(last_out_, HasSubstr("[rank 0] "));
  EXPECT_THAT(last_out_, HasSubstr("world size 2, started by loom, gloo backend"));
  EXPECT_THAT(last_out_, HasSubstr("batch: 2 micro-batches of 2 x 16 tokens"));
  expect_same_curve(one, dp2, "dp2");
  // The losses must move, or equality would prove nothing.
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.05);
  expect_gradients_match_one_rank("sgd_one", tiny_spec(), "sgd_dp2",
                                  "--nproc 2 --set parallel.dp=2");
}

TEST_F(ParallelTest, DistributedOptimizerMatchesOneRank) {
  Curve one = train("one", tiny_spec(), "");
  // Small buckets: several of them, each padded to a multiple of 2 and split in two shards
  // that cut parameters in the middle.
  Curve zero = train("zero1", tiny_spec(),
                     "--nproc 2 --set parallel.dp=2 --set parallel.distributed_optimizer=true "
                     "--set parallel.bucket_size=3001");
  EXPECT_THAT(last_out_, HasSubstr("distributed optimizer"));
  expect_same_curve(one, zero, "dp2 + distributed optimizer");
  expect_gradients_match_one_rank("sgd_one", tiny_spec(), "sgd_zero1",
                                  "--nproc 2 --set parallel.dp=2 --set "
                                  "parallel.distributed_optimizer=true --set "
                                  "parallel.bucket_size=3001");
}

// AdamW's moments in bf16 (Megatron's precision-aware optimizer) with the distributed
// optimizer: the ranks' shards of the bf16 states update as one rank's whole ones (the same
// curve); the checkpoint gathers them into bf16 tensors, and a run resharded to one rank
// (the states sliced back out of them) continues with the uninterrupted run's losses.
TEST_F(ParallelTest, Bf16MomentsWithTheDistributedOptimizerMatchOneRankAndReshard) {
  nlohmann::json s = tiny_spec();
  s["optimizer"]["exp_avg_dtype"] = "bf16";
  s["optimizer"]["exp_avg_sq_dtype"] = "bf16";
  Curve one = train("bf16m_one", s, "");
  s["checkpoint"] = {{"interval", 3}, {"save_at_end", true}};
  Curve zero = train("bf16m_zero1", s,
                     "--nproc 2 --set parallel.dp=2 --set parallel.distributed_optimizer=true "
                     "--set parallel.bucket_size=3001");
  expect_same_curve(one, zero, "dp2 + distributed optimizer, bf16 moments");
  fs::path ckpts = dir_ / "bf16m_zero1" / "checkpoints";
  nlohmann::json meta = nlohmann::json::parse(read_file(ckpts / "iter_0000003" / "metadata.json"));
  int moments = 0;
  for (const auto& [name, t] : meta["loom"]["tensors"].items())
    if (name.rfind("optim.exp_avg", 0) == 0) {
      EXPECT_EQ(t["dtype"], "bf16") << name;
      ++moments;
    }
  EXPECT_GT(moments, 10);
  fs::remove_all(ckpts / "iter_0000006");
  expect_resumes_like(s, ckpts, "bf16m_tp1", "", zero);
}

// Tensor parallelism: heads, MLP units and the vocabulary split over 2 ranks (the loss
// through vocab-parallel cross entropy); with sequence parallelism the norms and residuals
// run on sequence halves too.
TEST_F(ParallelTest, TensorParallelMatchesOneRank) {
  Curve one = train("one", tiny_spec(), "");
  Curve tp2 = train("tp2", tiny_spec(), "--nproc 2 --set parallel.tp=2");
  EXPECT_THAT(last_out_, HasSubstr("layout: tp=2 cp=1 ep=1 dp=1"));
  expect_same_curve(one, tp2, "tp2");
  Curve sp = train("tp2sp", tiny_spec(),
                   "--nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true");
  EXPECT_THAT(last_out_, HasSubstr("sequence parallel"));
  expect_same_curve(one, sp, "tp2 + sp");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.05);
  expect_gradients_match_one_rank("sgd_one", tiny_spec(), "sgd_tp2",
                                  "--nproc 2 --set parallel.tp=2");
  expect_gradients_match_one_rank(
      "sgd_one", tiny_spec(), "sgd_tp2sp",
      "--nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true");
}

// Vocabulary padding (Megatron's make_vocab_size_divisible_by): a vocabulary of 61 padded to
// 128 on one rank, to 256 over tp 2 (rank 1 holds padding only) and to 62 (divisible by 1,
// times tp 2) trains exactly as the unpadded 61: the padding's logits take no part in the
// loss, and the checkpoints hold the 61 vocabulary rows (the gradient comparison reads
// them, tensor by tensor, and requires equal shapes).
TEST_F(ParallelTest, PaddedVocabularyTrainsAsTheUnpadded) {
  nlohmann::json s = tiny_spec(), unpadded = tiny_spec();
  s["model"]["vocab_size"] = 61;
  unpadded["model"]["vocab_size"] = 61;
  unpadded["model"]["make_vocab_size_divisible_by"] = 1;
  Curve one = train("vocab61", unpadded, "");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.05);
  Curve padded = train("vocab61_padded", s, "");
  expect_same_curve(one, padded, "61 padded to 128");
  Curve tp2 = train("vocab61_tp2", s, "--nproc 2 --set parallel.tp=2");
  expect_same_curve(one, tp2, "61 padded to 256 over tp 2");
  expect_gradients_match_one_rank("sgd_vocab61", unpadded, "sgd_vocab61_padded", "");
  for (const auto& [name, args] : std::vector<std::pair<std::string, std::string>>{
           {"sgd_vocab61_tp2", "--nproc 2 --set parallel.tp=2"},
           {"sgd_vocab61_tp2_by1",
            "--nproc 2 --set parallel.tp=2 --set "
            "model.make_vocab_size_divisible_by=1"}})
    expect_gradients_match_one_rank("sgd_vocab61", s, name, args);
}

TEST_F(ParallelTest, TensorAndDataParallelMatchOneRank) {
  Curve one = train("one", tiny_spec(), "");
  Curve both = train("tp2dp2", tiny_spec(), "--nproc 4 --set parallel.tp=2 --set parallel.dp=2");
  expect_same_curve(one, both, "tp2 x dp2");
  Curve zero = train("tp2dp2zero", tiny_spec(),
                     "--nproc 4 --set parallel.tp=2 --set parallel.dp=2 --set "
                     "parallel.sequence_parallel=true --set parallel.distributed_optimizer=true "
                     "--set parallel.bucket_size=3001");
  expect_same_curve(one, zero, "tp2 x dp2 + sp + distributed optimizer");
  expect_gradients_match_one_rank("sgd_one", tiny_spec(), "sgd_tp2dp2",
                                  "--nproc 4 --set parallel.tp=2 --set parallel.dp=2");
  expect_gradients_match_one_rank(
      "sgd_one", tiny_spec(), "sgd_tp2dp2zero",
      "--nproc 4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.sequence_parallel=true "
      "--set parallel.distributed_optimizer=true --set parallel.bucket_size=3001");
}

// The LLaMA shape (rotary positions, RMSNorm, SwiGLU, grouped-query attention with one
// key/value group per rank, untied output layer, no biases), with hidden dropout: sequence
// shards draw exactly the dropout masks of the whole sequence.
TEST_F(ParallelTest, TensorParallelLlamaWithDropoutMatchesOneRank) {
  nlohmann::json s = tiny_spec();
  s["model"]["position_embedding"] = "rope";
  s["model"]["num_query_groups"] = 2;
  s["model"]["tie_embeddings"] = false;
  s["model"]["add_bias_linear"] = false;
  s["model"]["hidden_dropout"] = 0.1;
  s["model"]["layer"]["norm"] = {{"impl", "rmsnorm"}};
  s["model"]["final_norm"] = {{"impl", "rmsnorm"}};
  s["model"]["layer"]["mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  Curve one = train("llama_one", s, "");
  Curve sp = train("llama_tp2sp", s,
                   "--nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true");
  expect_same_curve(one, sp, "llama tp2 + sp");
  expect_gradients_match_one_rank(
      "sgd_llama_one", s, "sgd_llama_tp2sp",
      "--nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true");
}

// Small buckets (seven) with the reduction overlapped with the last backward pass:
// each bucket goes to the communication thread as soon as its modules signal grads_ready,
// while the rest of backward runs. The debug log counts the buckets handed over during
// backward: all of them (the embedding's, last in backward order, when its backward
// returns). With overlap off, the same buckets go after backward.
// The layers' weight gradients skip the zero fill here too (their first write of a step
// overwrites them): NaN put into them on one rank before every step
// (LOOM_TEST_FAULT=poison_overwrite) leaves the curves and gradients unchanged, which it
// would not if a write added to it or a bucket went out before the writes (train_test's
// control run shows that the poison reaches a run whose writes add).
TEST_F(ParallelTest, OverlappedGradientReductionMatchesOneRank) {
  Curve one = train("one", tiny_spec(), "");
  const std::string small =
      "--nproc 2 --set parallel.dp=2 --set parallel.bucket_size=3001 --set log.level=debug ";
  Curve overlap = train("overlap", tiny_spec(), small + "--set parallel.overlap_grad_reduce=true",
                        "LOOM_TEST_FAULT=poison_overwrite:1:1");
  expect_same_curve(one, overlap, "dp2, overlapped reduction, NaN before each step on rank 1");
  expect_all_buckets_early(last_err_, 2 * 6);
  expect_weight_grads_kept(last_err_, 2 * 6);
  Curve zero = train("overlap_zero1", tiny_spec(),
                     small +
                         "--set parallel.overlap_grad_reduce=true "
                         "--set parallel.distributed_optimizer=true",
                     "LOOM_TEST_FAULT=poison_overwrite:0:1");
  expect_same_curve(one, zero,
                    "dp2 + distributed optimizer, overlapped reduction, NaN before each step "
                    "on rank 0");
  expect_all_buckets_early(last_err_, 2 * 6);
  expect_weight_grads_kept(last_err_, 2 * 6);
  Curve after =
      train("no_overlap", tiny_spec(), small + "--set parallel.overlap_grad_reduce=false");
  expect_same_curve(one, after, "dp2, reduction after backward");
  EXPECT_THAT(last_err_, Not(HasSubstr("handed to the reduction during backward")));
  expect_gradients_match_one_rank("sgd_one", tiny_spec(), "sgd_overlap",
                                  small + "--set parallel.overlap_grad_reduce=true");
  expect_gradients_match_one_rank(
      "sgd_one", tiny_spec(), "sgd_overlap_zero1",
      small + "--set parallel.overlap_grad_reduce=true --set parallel.distributed_optimizer=true",
      kGradTolerance, "LOOM_TEST_FAULT=poison_overwrite:1:1");
}

TEST_F(ParallelTest, MixedPrecisionDataParallelMatchesOneRank) {
  nlohmann::json s = tiny_spec();
  s["precision"]["params"] = "bf16";
  s["train"]["steps"] = 5;
  Curve one = train("bf16_one", s, "");
  Curve dp2 = train("bf16_dp2", s,
                    "--nproc 2 --set parallel.dp=2 --set parallel.distributed_optimizer=true");
  // bf16 activations: the same order of operations within a micro-batch, so only the
  // gradient sums differ (in f32).
  ASSERT_EQ(one.loss.size(), dp2.loss.size());
  for (size_t i = 0; i < one.loss.size(); ++i)
    EXPECT_NEAR(one.loss[i], dp2.loss[i], 2e-3 * one.loss[i]) << "step " << i + 1;
  expect_gradients_match_one_rank(
      "sgd_bf16_one", s, "sgd_bf16_dp2",
      "--nproc 2 --set parallel.dp=2 --set parallel.distributed_optimizer=true",
      kBf16GradTolerance);
}

// FP8 (delayed scaling): the amaxes of a step are reduced (max) over tp and dp before the
// scales are updated, so every replica and every tensor-parallel shard quantises with the
// scales one rank would use on the whole batch and the whole weights.
TEST_F(ParallelTest, Fp8DataAndTensorParallelMatchOneRank) {
  nlohmann::json s = tiny_spec();
  s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "delayed"}, {"amax_history_len", 2}}}};
  s["train"]["steps"] = 5;
  Curve one = train("fp8_one", s, "");
  Curve dp2 = train("fp8_dp2", s, "--nproc 2 --set parallel.dp=2");
  Curve tp2 = train("fp8_tp2", s, "--nproc 2 --set parallel.tp=2");
  // Context-parallel ranks quantise halves of each sequence with the scales of the whole
  // (amaxes reduced over cp too) and gradients of one rank's magnitude.
  Curve cp2 = train("fp8_cp2", s, "--nproc 2 --set parallel.cp=2");
  ASSERT_EQ(one.loss.size(), 5u);
  for (auto [c, name] : {std::pair{&dp2, "dp2"}, {&tp2, "tp2"}, {&cp2, "cp2"}}) {
    ASSERT_EQ(one.loss.size(), c->loss.size());
    for (size_t i = 0; i < one.loss.size(); ++i)
      EXPECT_NEAR(one.loss[i], c->loss[i], 2e-3 * one.loss[i]) << name << " step " << i + 1;
  }
  // Step 1 of each layout, gradient by gradient, and the FP8 state after it (rank 0's, in
  // the checkpoint; the ranks showed theirs equal to it before saving, see
  // Fp8StateThatDisagreesAcrossRanksIsNotSaved). What one rank computes from the amaxes of the
  // whole batch and the whole weights, with two known differences:
  // - gradient quantisers at dp: Megatron's convention, which loom follows, divides each
  //   rank's loss by its own number of micro-batches and the gradients by dp in the
  //   reduction, so the gradients a rank quantises are dp x one rank's, and so are their
  //   amaxes (and the scales 1 / dp: a power of two, the same FP8 numbers).
  // - a sum in another order (row-parallel partial sums, attention over half sequences)
  //   changes a bf16 value by one unit in the last place (2^-7 relative at most), and a
  //   gradient quantised to e5m2 (2 mantissa bits) after it can round to a neighbour 12-25%
  //   away, which moves the amaxes downstream by a few percent.
  // So: forward quantisers (e4m3) within one bf16 ulp of one rank's; gradient quantisers
  // (e5m2) at dp x one rank's, exactly for at least half of them and within 10% for all;
  // every scale is fp8_max / its amax (the update used the reduced amaxes).
  for (const char* layout : {"dp2", "tp2", "cp2"}) {
    std::string name = std::string("sgd_fp8_") + layout;
    std::string args = std::string("--nproc 2 --set parallel.") + layout[0] + layout[1] + "=2";
    expect_gradients_match_one_rank("sgd_fp8_one", s, name, args, kFp8GradTolerance);
    auto a = step_one_checkpoint("sgd_fp8_one"), b = step_one_checkpoint(name);
    for (const char* state : {"fp8.amax_history", "fp8.scale"}) {
      ASSERT_TRUE(a.count(state) && b.count(state)) << name << ": " << state;
      ASSERT_EQ(a[state].size(), b[state].size()) << name << ": " << state;
    }
    const std::vector<float>&amax_one = a["fp8.amax_history"], &amax = b["fp8.amax_history"];
    const std::vector<float>&scale_one = a["fp8.scale"], &scale = b["fp8.scale"];
    const size_t quantizers = scale.size();
    ASSERT_EQ(amax.size(), 2 * quantizers) << "amax_history_len 2";
    const double dp = std::string(layout) == "dp2" ? 2 : 1;
    double worst_forward = 0, worst_gradient = 0, worst_scale = 0;
    int gradients = 0, exact_gradients = 0;
    for (size_t q = 0; q < quantizers; ++q) {
      // Row 0: step 1's amaxes. The role from the one-rank scale: fp8_max = scale * amax,
      // 448 for e4m3 (forward), 57344 for e5m2 (gradients: the hybrid format).
      const double fp8_max = static_cast<double>(scale_one[q]) * amax_one[q];
      const bool gradient = std::abs(fp8_max / 57344 - 1) < 1e-3;
      ASSERT_TRUE(gradient || std::abs(fp8_max / 448 - 1) < 1e-3)
          << "quantiser " << q << ": scale * amax = " << fp8_max << ", not an FP8 maximum";
      ASSERT_GT(amax_one[q], 0) << "quantiser " << q << " saw nothing";
      const double ratio = amax[q] / (gradient ? dp : 1.0) / amax_one[q];
      if (gradient) {
        ++gradients;
        exact_gradients += ratio == 1.0;
        worst_gradient = std::max(worst_gradient, std::abs(ratio - 1));
      } else {
        worst_forward = std::max(worst_forward, std::abs(ratio - 1));
      }
      worst_scale =
          std::max(worst_scale, std::abs(static_cast<double>(scale[q]) * amax[q] / fp8_max - 1));
    }
    std::printf(
        "%s: FP8 state after step 1 against one rank's: forward amaxes within %.3g, "
        "gradient amaxes / %g within %.3g (%d of %d exactly), scale * amax = fp8_max "
        "within %.3g\n",
        name.c_str(), worst_forward, dp, worst_gradient, exact_gradients, gradients, worst_scale);
    EXPECT_LE(worst_forward, std::ldexp(1.0, -7)) << name << ": forward amaxes";
    EXPECT_LE(worst_gradient, 0.10) << name << ": gradient amaxes / dp";
    EXPECT_GE(2 * exact_gradients, gradients) << name << ": gradient amaxes exactly dp x one's";
    EXPECT_LE(worst_scale, 1e-6) << name << ": scales";
  }
}

// rope_fp8_bwd on a layout's share of the QKV gradient (this rank's heads under tp, half
// sequences under cp, with their own position ids): the bits of rope_bwd then the
// quantisation, so each layout's run is its pinned-off run's to the bit, loss and gradient
// norm at every step.
TEST_F(ParallelTest, Fp8RopeQuantisedInItsKernelGivesTheUnfusedBitsUnderTpAndCp) {
  nlohmann::json s = tiny_spec();
  s["model"]["position_embedding"] = "rope";
  s["model"]["add_bias_linear"] = false;
  s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "delayed"}, {"amax_history_len", 2}}}};
  s["train"]["steps"] = 3;
  nlohmann::json pinned = s;
  pinned["kernels"] = {{"pin", {{"rope_fp8_bwd", "none"}}}};
  for (const char* layout : {"tp2", "cp2"}) {
    const std::string args =
        std::string("--nproc 2 --set parallel.") + layout[0] + layout[1] + "=2";
    Curve fused = train(std::string("rope_fp8_") + layout, s, args);
    EXPECT_THAT(last_out_, HasSubstr("rope_fp8_bwd:bf16=cpu.")) << layout;
    Curve unfused = train(std::string("rope_fp8_pinned_") + layout, pinned, args);
    EXPECT_THAT(last_out_, Not(HasSubstr("rope_fp8_bwd:bf16=cpu."))) << layout;
    ASSERT_EQ(fused.loss.size(), 3u) << layout;
    ASSERT_EQ(unfused.loss.size(), 3u) << layout;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(fused.loss[i], unfused.loss[i]) << layout << " step " << i + 1;
      EXPECT_EQ(fused.grad_norm[i], unfused.grad_norm[i]) << layout << " step " << i + 1;
    }
    std::printf(
        "rope_fp8_bwd %s: 3 steps' losses and gradient norms bit-identical to rope_bwd + "
        "fp8_quantize\n",
        layout);
  }
}

// Rank 0 writes the FP8 state for every rank of the amax group; before it does, the ranks
// compare their copies. A rank whose scales were changed behind the recipe's back
// (LOOM_TEST_FAULT fp8_skew) makes the save fail, naming the rank, instead of saving a state
// that resumes it with scales it never had.
TEST_F(ParallelTest, Fp8StateThatDisagreesAcrossRanksIsNotSaved) {
  nlohmann::json s = tiny_spec();
  s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "delayed"}, {"amax_history_len", 2}}}};
  s["train"]["steps"] = 3;
  s["checkpoint"] = {{"interval", 1}};
  fs::path run = dir_ / "fp8_skew";
  auto r = run_loom("train " + q(spec("fp8_skew.json", s)) + " --run-dir " + q(run) +
                        " --nproc 2 --set parallel.tp=2",
                    "LOOM_TEST_FAULT=fp8_skew:1:1");
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("checkpoint of step 1: the FP8 recipe's state"));
  EXPECT_THAT(r.err, HasSubstr("amax-group rank(s) 1 differs from rank 0's"));
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "latest")) << "a checkpoint was saved";
}

TEST_F(ParallelTest, DataParallelCheckpointResumes) {
  nlohmann::json s = tiny_spec();
  s["checkpoint"] = {{"interval", 3}, {"save_at_end", true}};
  fs::path run = dir_ / "ckpt";
  std::string args = "train " + q(spec("ckpt.json", s)) + " --run-dir " + q(run) +
                     " --nproc 2 --set parallel.dp=2";
  auto full = run_loom(args);
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  Curve whole = read_curve(run / "metrics.jsonl");
  // Continue from step 3 of the same run: the last three steps again.
  fs::remove_all(run / "checkpoints" / "iter_0000006");
  write_file(run / "checkpoints" / "latest", "iter_0000003\n");
  auto resumed = run_loom(args + " --set checkpoint.resume=\"auto\"");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("resume: iteration 3"));
  Curve again = read_curve(run / "metrics.jsonl");
  ASSERT_EQ(again.loss.size(), whole.loss.size());
  for (size_t i = 0; i < whole.loss.size(); ++i)
    EXPECT_DOUBLE_EQ(again.loss[i], whole.loss[i]) << "step " << i + 1;
}

// Resharding: a sharded checkpoint saved at (tp 2, dp 2) with the distributed optimizer
// (every rank its slices; the optimizer states gathered over dp) resumes at (tp 1, dp 1),
// (tp 4, dp 1), (dp 2) without and (dp 4) with the distributed optimizer, and the runs
// continue with the losses of the uninterrupted one.
TEST_F(ParallelTest, ShardedCheckpointReshardsAcrossLayouts) {
  nlohmann::json s = tiny_spec();
  s["checkpoint"] = {{"interval", 3}, {"save_at_end", true}};
  fs::path run = dir_ / "reshard";
  auto full = run_loom("train " + q(spec("reshard.json", s)) + " --run-dir " + q(run) +
                       " --nproc 4 --set parallel.tp=2 --set parallel.dp=2 --set "
                       "parallel.distributed_optimizer=true --set parallel.bucket_size=3001");
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  Curve whole = read_curve(run / "metrics.jsonl");
  ASSERT_EQ(whole.loss.size(), 6u);
  fs::path ckpts = run / "checkpoints";
  ASSERT_TRUE(fs::exists(ckpts / "iter_0000003" / "shards" / "rank_00003.json"));  // 4 writers
  fs::remove_all(ckpts / "iter_0000006");  // continue from step 3
  struct Layout {
    std::string name, args;
  };
  // Also at another dp: dp 2 without the distributed optimizer (the states gathered over
  // dp load whole on each replica), and dp 4 with it (sliced four ways).
  for (const Layout& layout :
       {Layout{"tp1", ""}, Layout{"tp4", "--nproc 4 --set parallel.tp=4"},
        Layout{"dp2", "--nproc 2 --set parallel.dp=2"},
        Layout{"dp4zero",
               "--nproc 4 --set parallel.dp=4 --set parallel.distributed_optimizer=true"}})
    expect_resumes_like(s, ckpts, layout.name, layout.args, whole);
  // Slices need a format that keeps them.
  auto r = run_loom("train " + q(spec("reshard.json", s)) + " --run-dir " + q(dir_ / "st") +
                    " --nproc 2 --set parallel.tp=2 --set checkpoint.format.impl=safetensors");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("use the sharded format"));
}

// Pipeline parallelism: the 4-layer model cut into stages, run by each schedule, against
// one rank. SGD without momentum at a constant rate and no clipping makes the first
// checkpoint (after step 1) the initial weights minus lr times the gradients, so comparing
// it across layouts compares every parameter's gradient (a gradient off by a constant
// factor, which AdamW would hide, shows); the loss, grad norm and validation loss are
// compared at every step. The table is tied (the default), so the last stage's copy of it
// must stay in step with the first stage's.
nlohmann::json pipeline_spec() {
  nlohmann::json s = tiny_spec();
  s["model"]["num_layers"] = 4;
  s["optimizer"] = {{"impl", "sgd"}, {"lr", 0.5}, {"momentum", 0.0}};
  s["lr_schedule"] = {{"impl", "constant"}};
  s["train"]["grad_clip"] = 0.0;
  s["train"]["steps"] = 5;
  s["checkpoint"] = {{"interval", 1}, {"keep", 5}, {"save_at_end", true}};
  return s;
}

// Pipeline layouts, against one rank gradient by gradient (ParallelTest's
// expect_same_gradients).
class PipelineTest : public ParallelTest {};

TEST_F(PipelineTest, EverySchedulesMatchesOneRankToEachGradient) {
  Curve one = train("one", pipeline_spec(), "");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.02);  // it learns: equality means something
  struct Layout {
    std::string name, args, banner;
  };
  const std::vector<Layout> layouts = {
      {"pp2", "--nproc 2 --set parallel.pp=2", "pipeline: 1f1b"},
      {"pp4", "--nproc 4 --set parallel.pp=4", "pipeline: 1f1b"},
      {"pp2vpp2", "--nproc 2 --set parallel.pp=2 --set parallel.vpp=2", "pipeline: interleaved"},
      {"pp2zb", "--nproc 2 --set parallel.pp=2 --set parallel.pipeline_schedule.impl=zb_h1",
       "pipeline: zb_h1"},
      {"pp2tp2sp",
       "--nproc 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true",
       "pipeline: 1f1b"},
      // Megatron's layout string: an empty stage (it passes its input through), a last stage
      // with the loss alone, vpp 2 inferred (4 stages / pp 2).
      {"pp2layout", "--nproc 2 --set parallel.pp=2 --set 'parallel.pipeline_layout=\"Ett||tt|L\"'",
       "pipeline: interleaved, 2 stages x 2 virtual chunks"},
      {"pp2first1",
       "--nproc 2 --set parallel.pp=2 --set parallel.num_layers_in_first_pipeline_stage=1",
       "pipeline: 1f1b"},
      {"pp2dp2zero",
       "--nproc 4 --set parallel.pp=2 --set parallel.dp=2 --set "
       "parallel.distributed_optimizer=true --set parallel.overlap_grad_reduce=true --set "
       "parallel.bucket_size=3001",
       "pipeline: 1f1b"},
  };
  for (const Layout& layout : layouts) {
    Curve c = train(layout.name, pipeline_spec(), layout.args);
    EXPECT_THAT(last_out_, HasSubstr(layout.banner)) << layout.name;
    expect_same_curve(one, c, layout.name);
    expect_same_gradients("one", layout.name, one.grad_norm[0]);
  }
  // The pp2 run's trace: steps 2 to 4 (log.trace_steps 3), every action of both ranks, and
  // the measured bubble in the metrics.
  nlohmann::json trace =
      nlohmann::json::parse(read_file(dir_ / "pp2" / "pipeline_trace.json"))["traceEvents"];
  std::map<std::pair<int, std::string>, int> count;
  for (const nlohmann::json& e : trace)
    if (e["ph"] == "X") {
      ++count[{e["pid"].get<int>(), e["cat"].get<std::string>()}];
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
  for (int rank : {0, 1}) {
    EXPECT_EQ((count[{rank, "forward"}]), 3 * 4) << rank;  // 3 steps x 4 micro-batches
    EXPECT_EQ((count[{rank, "backward"}]), 3 * 4) << rank;
  }
  EXPECT_EQ((count[{0, "send_activation"}]), 12);
  EXPECT_EQ((count[{1, "recv_activation"}]), 12);
  EXPECT_EQ((count[{0, "recv_grad"}]), 12);
  std::stringstream lines(read_file(dir_ / "pp2" / "metrics.jsonl"));
  std::string line;
  int bubbles = 0;
  while (std::getline(lines, line)) {
    nlohmann::json m = nlohmann::json::parse(line);
    if (!m.contains("pipeline_bubble")) continue;
    ++bubbles;
    EXPECT_GE(m["pipeline_bubble"].get<double>(), 0.0);
    EXPECT_LT(m["pipeline_bubble"].get<double>(), 1.0);
  }
  EXPECT_EQ(bubbles, 5);
}

// Context parallelism: every sequence split over cp ranks (2 cp chunks, rank r holding
// chunks r and 2cp-1-r), keys and values passed around a ring (p2p) or gathered
// (all_gather); equal to one rank at every step and in every parameter's gradient after
// step 1. Learned positions (gpt) with both attention cores, a ring of four, with tensor and
// sequence parallelism, with a pipeline, with data parallelism and the distributed
// optimizer; RoPE with grouped-query attention and dropout (a LLaMA shape); packed documents.
TEST_F(PipelineTest, ContextParallelMatchesOneRankToEachGradient) {
  struct Layout {
    std::string name, args;
  };
  nlohmann::json gpt = pipeline_spec();
  Curve one = train("cp_one", gpt, "");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.02);  // it learns: equality means something
  const std::vector<Layout> layouts = {
      {"cp2", "--nproc 2 --set parallel.cp=2"},
      {"cp2gather_dot",
       "--nproc 2 --set parallel.cp=2 --set 'parallel.cp_comm_type=\"all_gather\"' --set "
       "'model.layer.attention.impl=\"dot_product\"'"},
      {"cp4", "--nproc 4 --set parallel.cp=4"},
      {"cp2tp2sp",
       "--nproc 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"cp2pp2", "--nproc 4 --set parallel.cp=2 --set parallel.pp=2"},
      {"cp2dp2zero",
       "--nproc 4 --set parallel.cp=2 --set parallel.dp=2 --set "
       "parallel.distributed_optimizer=true"},
  };
  for (const Layout& layout : layouts) {
    Curve c = train(layout.name, gpt, layout.args);
    EXPECT_THAT(last_out_, HasSubstr("cp=" + std::string(layout.name.substr(2, 1)))) << layout.name;
    expect_same_curve(one, c, layout.name);
    expect_same_gradients("cp_one", layout.name, one.grad_norm[0]);
  }
  nlohmann::json llama = pipeline_spec();
  llama["model"]["position_embedding"] = "rope";
  llama["model"]["num_query_groups"] = 2;
  llama["model"]["tie_embeddings"] = false;
  llama["model"]["add_bias_linear"] = false;
  llama["model"]["layer"]["norm"] = {{"impl", "rmsnorm"}};
  llama["model"]["final_norm"] = {{"impl", "rmsnorm"}};
  llama["model"]["layer"]["mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  // Dropout draws the one-rank masks: hidden dropout by global row, attention dropout by
  // each block's place in the whole (T, T) matrix.
  llama["model"]["hidden_dropout"] = 0.1;
  llama["model"]["attention_dropout"] = 0.1;
  Curve llama_one = train("cp_llama_one", llama, "");
  Curve llama_cp = train("cp_llama_cp2", llama, "--nproc 2 --set parallel.cp=2");
  expect_same_curve(llama_one, llama_cp, "llama cp2");
  expect_same_gradients("cp_llama_one", "cp_llama_cp2", llama_one.grad_norm[0]);

  // Qwen-style attention: q/k/v biases, per-head q/k norms (their weights' gradients summed
  // over tp) and YaRN scaling (its attention factor on q and k), over context and tensor
  // ranks with sequence parallelism. Without attention dropout: under tp each rank draws its
  // own stream (Megatron's model-parallel RNG, README), not the one-rank masks.
  // Gradients read by loom's names (no Hugging Face family has both biases and q/k norms).
  loom_names_ = true;
  nlohmann::json qwen = llama;
  qwen["model"]["attention_dropout"] = 0.0;
  qwen["model"]["add_qkv_bias"] = true;
  qwen["model"]["qk_layernorm"] = true;
  qwen["model"]["rotary"] = nlohmann::json::parse(R"({"base": 1000000, "percent": 1.0,
    "scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64}})");
  Curve qwen_one = train("cp_qwen_one", qwen, "");
  Curve qwen_cp_tp = train(
      "cp_qwen_cp2tp2sp", qwen,
      "--nproc 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true");
  expect_same_curve(qwen_one, qwen_cp_tp, "qwen-style cp2 x tp2 + sp");
  expect_same_gradients("cp_qwen_one", "cp_qwen_cp2tp2sp", qwen_one.grad_norm[0]);

  // Packed documents (a corpus of short texts, Megatron's reset_attention_mask and
  // reset_position_ids): segment ids and positions follow the chunks, and attention stays
  // within each document across ranks.
  fs::create_directories(dir_ / "texts");
  const char* words[] = {"red", "fox", "jumps", "over", "lazy", "dog", "a", "the", "sun"};
  for (int d = 0; d < 40; ++d) {
    std::string text;
    for (int w = 0; w < 2 + d % 5; ++w) text += std::string(words[(d * 7 + w * 3) % 9]) + " ";
    write_file(dir_ / "texts" / ("doc" + std::to_string(d) + ".txt"), text);
  }
  nlohmann::json packed = llama;
  packed["model"]["vocab_size"] = 320;
  packed["data"] = {{"corpus",
                     {{"inputs", {(dir_ / "texts").string()}},
                      {"vocab_size", 300},
                      {"cache_dir", (dir_ / "corpora").string()}}},
                    {"reset_attention_mask", true},
                    {"reset_position_ids", true}};
  Curve packed_one = train("cp_packed_one", packed, "");
  Curve packed_cp = train("cp_packed_cp2", packed, "--nproc 2 --set parallel.cp=2");
  expect_same_curve(packed_one, packed_cp, "packed documents cp2");
  expect_same_gradients("cp_packed_one", "cp_packed_cp2", packed_one.grad_norm[0]);
}

// A Mamba-2 hybrid (Nemotron-H style: Mamba, attention-only and MLP-only layers, no
// positions): tensor parallel with sequence parallelism (each rank one of the mixer's two
// groups with its heads), data parallel with the distributed optimizer, and pipeline stages
// cut by the pattern's |, equal to one rank at every step and in every parameter's gradient
// after step 1 (read by loom's names: no Hugging Face family holds it).
TEST_F(PipelineTest, MambaHybridMatchesOneRankToEachGradient) {
  loom_names_ = true;
  nlohmann::json s = pipeline_spec();
  nlohmann::json& m = s["model"];
  m["hybrid_layer_pattern"] = "M*|M-";
  m["position_embedding"] = "none";
  m["add_bias_linear"] = false;
  m["tie_embeddings"] = false;
  m["layer"]["norm"] = {{"impl", "rmsnorm"}};
  m["final_norm"] = {{"impl", "rmsnorm"}};
  m["layer"]["mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  m["mamba_layer"] = nlohmann::json::parse(R"({"impl": "mamba_layer",
    "mixer": {"impl": "mamba2", "state_dim": 8, "head_dim": 8, "num_groups": 2,
              "chunk_size": 4}})");
  Curve one = train("hybrid_one", s, "");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.02);  // it learns: equality means something
  struct Layout {
    std::string name, args;
  };
  const std::vector<Layout> layouts = {
      {"hybrid_tp2sp", "--nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"hybrid_dp2zero", "--nproc 2 --set parallel.dp=2 --set parallel.distributed_optimizer=true"},
      {"hybrid_pp2", "--nproc 2 --set parallel.pp=2"},
  };
  for (const Layout& layout : layouts) {
    Curve c = train(layout.name, s, layout.args);
    expect_same_curve(one, c, layout.name);
    expect_same_gradients("hybrid_one", layout.name, one.grad_norm[0]);
  }
}

// Multi-latent attention (DeepSeek-V3 style: query and key/value latents, the shared rotary
// key, YaRN's attention factor): tensor parallel with sequence parallelism (the latent path
// replicated, its gradients summed over tp), data parallel with the distributed optimizer,
// context parallel and two pipeline stages, equal to one rank at every step and in every
// parameter's gradient after step 1 (by loom's names).
TEST_F(PipelineTest, MultiLatentAttentionMatchesOneRankToEachGradient) {
  loom_names_ = true;
  nlohmann::json s = pipeline_spec();
  nlohmann::json& m = s["model"];
  m["position_embedding"] = "rope";
  m["rotary"] = nlohmann::json::parse(R"({"base": 10000, "percent": 1.0,
    "scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 8}})");
  m["multi_latent_attention"] = nlohmann::json::parse(R"({"q_lora_rank": 12,
    "kv_lora_rank": 10, "qk_head_dim": 6, "qk_pos_emb_head_dim": 4, "v_head_dim": 8})");
  m["add_bias_linear"] = false;
  m["tie_embeddings"] = false;
  m["layer"]["norm"] = {{"impl", "rmsnorm"}};
  m["final_norm"] = {{"impl", "rmsnorm"}};
  m["layer"]["mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  Curve one = train("mla_one", s, "");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.02);  // it learns: equality means something
  struct Layout {
    std::string name, args;
  };
  const std::vector<Layout> layouts = {
      {"mla_tp2sp", "--nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"mla_dp2zero", "--nproc 2 --set parallel.dp=2 --set parallel.distributed_optimizer=true"},
      {"mla_cp2", "--nproc 2 --set parallel.cp=2"},
      {"mla_pp2", "--nproc 2 --set parallel.pp=2"},
  };
  for (const Layout& layout : layouts) {
    Curve c = train(layout.name, s, layout.args);
    expect_same_curve(one, c, layout.name);
    expect_same_gradients("mla_one", layout.name, one.grad_norm[0]);
  }
}

// Multi-token prediction (DeepSeek-V3 style, two depths sharing the tied word table and
// output weight): tensor parallel with sequence parallelism (vocab-parallel lookups and
// loss, eh_proj and the norms replicated with their gradients summed over tp) and data
// parallel, equal to one rank at every step and in every parameter's gradient after step 1;
// the MTP loss is reported on its own; pipeline and context parallelism are refused.
TEST_F(PipelineTest, MultiTokenPredictionMatchesOneRankToEachGradient) {
  loom_names_ = true;
  nlohmann::json s = pipeline_spec();
  nlohmann::json& m = s["model"];
  m["num_layers"] = 2;
  m["position_embedding"] = "rope";
  m["add_bias_linear"] = false;
  m["layer"]["norm"] = {{"impl", "rmsnorm"}};
  m["final_norm"] = {{"impl", "rmsnorm"}};
  m["mtp_num_layers"] = 2;
  m["mtp_loss_scaling_factor"] = 0.3;
  s["train"]["steps"] = 5;
  Curve one = train("mtp_one", s, "");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.02);  // it learns: equality means something
  const std::string metrics = read_file(dir_ / "mtp_one" / "metrics.jsonl");
  EXPECT_THAT(metrics, HasSubstr("\"mtp_loss\""));
  EXPECT_THAT(metrics, HasSubstr("mtp/loss/depth_2"));
  struct Layout {
    std::string name, args;
  };
  const std::vector<Layout> layouts = {
      {"mtp_tp2sp", "--nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"mtp_dp2", "--nproc 2 --set parallel.dp=2"},
  };
  for (const Layout& layout : layouts) {
    Curve c = train(layout.name, s, layout.args);
    expect_same_curve(one, c, layout.name);
    expect_same_gradients("mtp_one", layout.name, one.grad_norm[0]);
  }
  for (auto [args, rule] : std::vector<std::pair<std::string, std::string>>{
           {"--nproc 2 --set parallel.pp=2",
            "multi-token prediction with parallel.pp > 1 is not supported yet"},
           {"--nproc 2 --set parallel.cp=2",
            "multi-token prediction with parallel.cp > 1 is not supported yet"}}) {
    auto r = run_loom("train " + q(spec("mtp_refused.json", s)) + " --run-dir " +
                      q(dir_ / "mtp_refused") + " " + args);
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(rule)) << args;
  }
}

// Mixture of experts: the experts split over ep ranks (the dense parameters' data replicas),
// tokens moved by all-to-all or all-gather, equal to one rank at every step and in every
// parameter's gradient after step 1. A Mixtral-like model (softmax top-2, aux and z losses)
// at ep2 with both dispatchers, ep4 (one expert per rank), ep2 with tensor and sequence
// parallelism (etp 1), ep2 with data parallelism and the distributed optimizer, ep2 with
// context parallelism, ep2 with a capacity factor that drops tokens; a DeepSeek-like one
// (sigmoid scores, group-limited routing, the aux-free expert bias, seq_aux_loss, a gated
// shared expert, a dense first layer) at ep2 with the distributed optimizer. Checkpoints of
// an ep2 run resume at ep1 and ep4 with the one-rank losses.
nlohmann::json moe_spec() {
  nlohmann::json s = pipeline_spec();
  s["model"]["position_embedding"] = "rope";
  s["model"]["add_bias_linear"] = false;
  s["model"]["layer"]["norm"] = {{"impl", "rmsnorm"}};
  s["model"]["final_norm"] = {{"impl", "rmsnorm"}};
  // Qwen3-MoE's per-head q/k norms: their weights' gradients are summed over tp (checked by
  // the tp and cp layouts below, to each gradient).
  s["model"]["qk_layernorm"] = true;
  s["model"]["layer"]["mlp"] = nlohmann::json::parse(R"({
    "impl": "moe", "num_experts": 4, "moe_ffn_hidden_size": 32, "activation": "swiglu",
    "router": {"impl": "topk", "topk": 2, "aux_loss_coeff": 0.01, "z_loss_coeff": 0.001},
    "dispatcher": {"impl": "alltoall"}})");
  return s;
}

TEST_F(PipelineTest, ExpertParallelMatchesOneRankToEachGradient) {
  loom_names_ = true;
  struct Layout {
    std::string name, args;
  };
  nlohmann::json mixtral = moe_spec();
  Curve one = train("moe_one", mixtral, "");
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.02);  // it learns: equality means something
  EXPECT_THAT(read_file(dir_ / "moe_one" / "metrics.jsonl"), HasSubstr("moe/aux_loss/layer_1"));
  const std::vector<Layout> layouts = {
      {"ep2", "--nproc 2 --set parallel.ep=2"},
      {"ep2gather",
       "--nproc 2 --set parallel.ep=2 --set "
       "'model.layer.mlp.dispatcher.impl=\"allgather\"'"},
      {"ep4", "--nproc 4 --set parallel.ep=4"},
      {"ep2tp2sp",
       "--nproc 4 --set parallel.ep=2 --set parallel.tp=2 --set "
       "parallel.sequence_parallel=true --set parallel.etp=1"},
      {"ep2dp2zero",
       "--nproc 4 --set parallel.ep=2 --set parallel.dp=2 --set "
       "parallel.distributed_optimizer=true"},
      {"ep2cp2", "--nproc 4 --set parallel.ep=2 --set parallel.cp=2"},
      // Expert tensor parallelism: etp != tp (each expert's F over the two data ranks), etp
      // = tp (the default) under sequence parallelism, and with ep and the allgather
      // dispatcher.
      {"etp2dp2", "--nproc 2 --set parallel.dp=2 --set parallel.etp=2"},
      // Full recomputation reruns routing, dispatch and the etp exchanges in backward.
      {"ep2etp2full",
       "--nproc 4 --set parallel.ep=2 --set parallel.dp=2 --set parallel.etp=2 "
       "--set 'train.recompute=\"full\"'"},
      {"ep2tp2etp2",
       "--nproc 4 --set parallel.ep=2 --set parallel.tp=2 --set "
       "parallel.sequence_parallel=true"},
      {"ep2etp2gather",
       "--nproc 4 --set parallel.ep=2 --set parallel.dp=2 --set parallel.etp=2 "
       "--set 'model.layer.mlp.dispatcher.impl=\"allgather\"'"},
  };
  for (const Layout& layout : layouts) {
    Curve c = train(layout.name, mixtral, layout.args);
    expect_same_curve(one, c, layout.name);
    expect_same_gradients("moe_one", layout.name, one.grad_norm[0]);
  }
  // Checkpoints written at ep2 (each rank its own experts) resume at ep1 and ep4.
  fs::path ckpts = dir_ / "ep2" / "checkpoints";
  ASSERT_TRUE(fs::exists(ckpts / "iter_0000003" / "shards" / "rank_00001.json"));
  fs::remove_all(ckpts / "iter_0000004");
  fs::remove_all(ckpts / "iter_0000005");
  for (const Layout& layout : {Layout{"ep1", ""}, Layout{"ep4", "--nproc 4 --set parallel.ep=4"}})
    expect_resumes_like(mixtral, ckpts, "moe_" + layout.name, layout.args, one);
  // Checkpoints written at etp2 (each rank its slice of every expert) resume on one rank.
  fs::path etp_ckpts = dir_ / "etp2dp2" / "checkpoints";
  fs::remove_all(etp_ckpts / "iter_0000004");
  fs::remove_all(etp_ckpts / "iter_0000005");
  expect_resumes_like(mixtral, etp_ckpts, "moe_etp_ep1", "", one);

  // A capacity factor of 0.5 drops about half the choices, the same ones on every layout.
  nlohmann::json dropping = mixtral;
  dropping["model"]["layer"]["mlp"]["expert_capacity_factor"] = 0.5;
  Curve drop_one = train("moe_drop_one", dropping, "");
  Curve drop_ep2 = train("moe_drop_ep2", dropping, "--nproc 2 --set parallel.ep=2");
  expect_same_curve(drop_one, drop_ep2, "capacity 0.5 at ep2");
  expect_same_gradients("moe_drop_one", "moe_drop_ep2", drop_one.grad_norm[0]);
  Curve drop_gather = train("moe_drop_ep2gather", dropping,
                            "--nproc 2 --set parallel.ep=2 --set "
                            "'model.layer.mlp.dispatcher.impl=\"allgather\"'");
  expect_same_curve(drop_one, drop_gather, "capacity 0.5 at ep2, allgather");
  expect_same_gradients("moe_drop_one", "moe_drop_ep2gather", drop_one.grad_norm[0]);
  // Padded to capacity (factor 1: some experts drop, the others get filler rows of prob 0):
  // every expert receives the same rows, and the result is the unpadded one.
  nlohmann::json capacity1 = mixtral;
  capacity1["model"]["layer"]["mlp"]["expert_capacity_factor"] = 1.0;
  Curve cap_one = train("moe_cap1_one", capacity1, "");
  nlohmann::json padded = capacity1;
  padded["model"]["layer"]["mlp"]["pad_to_capacity"] = true;
  Curve pad_ep2 =
      train("moe_pad_ep2", padded, "--nproc 2 --set parallel.ep=2 --set 'log.level=\"debug\"'");
  expect_same_curve(cap_one, pad_ep2, "padded to capacity at ep2");
  expect_same_gradients("moe_cap1_one", "moe_pad_ep2", cap_one.grad_norm[0]);
  {
    std::string log = last_out_ + last_err_;
    const std::regex line(R"(received (\d+) rows \((\d+) (\d+) per local expert\))");
    int lines = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
         ++it, ++lines) {
      EXPECT_EQ((*it)[2], (*it)[3]) << "padded experts receive equal rows: " << (*it)[0];
    }
    EXPECT_GT(lines, 0) << "the dispatcher's debug lines";
  }
  // The drops changed the gradients (the comparison above means something).
  auto kept = step_one("moe_one"), dropped = step_one("moe_drop_one");
  double change = 0;
  for (const auto& [name, v] : kept)
    for (size_t i = 0; i < v.size(); ++i)
      change = std::max(change, std::abs(static_cast<double>(v[i]) - dropped.at(name)[i]) / 0.5);
  EXPECT_GT(change, 1e-3 * one.grad_norm[0]);

  // Ranks whose experts receive no token: after step 1 the aux-free bias (rate 10) puts every
  // token on the experts that were under-loaded, so the others get none in step 2.
  nlohmann::json starving = mixtral;
  starving["model"]["layer"]["mlp"]["router"] = nlohmann::json::parse(R"({
    "impl": "topk", "topk": 1, "score_function": "sigmoid", "enable_expert_bias": true,
    "bias_update_rate": 10.0})");
  starving["train"]["steps"] = 5;
  Curve starve_one = train("moe_starve_one", starving, "");
  Curve starve_ep4 = train("moe_starve_ep4", starving,
                           "--nproc 4 --set parallel.ep=4 --set 'log.level=\"debug\"'");
  expect_same_curve(starve_one, starve_ep4, "ep4 with ranks that receive no token");
  expect_same_gradients("moe_starve_one", "moe_starve_ep4", starve_one.grad_norm[0]);
  EXPECT_THAT(last_out_ + last_err_,
              ::testing::ContainsRegex("rank [0-3] of the expert group received 0 rows"));
  Curve starve_gather = train("moe_starve_ep4gather", starving,
                              "--nproc 4 --set parallel.ep=4 --set "
                              "'model.layer.mlp.dispatcher.impl=\"allgather\"'");
  expect_same_curve(starve_one, starve_gather, "ep4 allgather with ranks that receive no token");

  nlohmann::json deepseek = moe_spec();
  deepseek["model"]["moe_layer_freq"] = {0, 1, 1, 1};
  deepseek["model"]["layer"]["dense_mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  deepseek["model"]["layer"]["mlp"] = nlohmann::json::parse(R"({
    "impl": "moe", "num_experts": 8, "moe_ffn_hidden_size": 16, "activation": "swiglu",
    "shared_expert_intermediate_size": 32, "shared_expert_gate": true,
    "router": {"impl": "topk", "topk": 2, "score_function": "sigmoid", "num_groups": 4,
               "group_topk": 2, "topk_scaling_factor": 2.5, "enable_expert_bias": true,
               "bias_update_rate": 0.01, "load_balancing_type": ["seq_aux_loss"],
               "aux_loss_coeff": [0.001]},
    "dispatcher": {"impl": "allgather"}})");
  Curve ds_one = train("moe_ds_one", deepseek, "");
  Curve ds_ep2 = train("moe_ds_ep2zero", deepseek,
                       "--nproc 2 --set parallel.ep=2 --set parallel.distributed_optimizer=true");
  expect_same_curve(ds_one, ds_ep2, "deepseek-like ep2 with the distributed optimizer");
  expect_same_gradients("moe_ds_one", "moe_ds_ep2zero", ds_one.grad_norm[0]);
}

// Options of a mixture of experts that cannot work are refused before training starts,
// naming the place and the rule.
TEST_F(ParallelTest, BadMixtureOfExpertsOptionsAreRefusedBeforeStart) {
  fs::path sp = spec("moe.json", moe_spec());
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"--set model.layer.mlp.router.topk=5",
            "spec /model/layer/mlp/router/topk: 5 must be in [1, num_experts = 4]"},
           {"--nproc 3 --set parallel.ep=3 --set train.global_batch_size=6",
            "spec /model/layer/mlp/num_experts: 4 is not divisible by the expert-parallel size 3"},
           {"--set model.layer.mlp.expert_capacity_factor=0",
            "spec /model/layer/mlp/expert_capacity_factor: expected number > 0"},
           {"--set model.layer.mlp.pad_to_capacity=true",
            "spec /model/layer/mlp/pad_to_capacity: padding every expert to its capacity needs "
            "a capacity"},
           {"--set 'model.moe_layer_freq=[1, 0]'",
            "spec /model/moe_layer_freq: a pattern of 2 entries for 4 layers"},
           {"--nproc 2 --set parallel.tp=2",
            "spec /parallel/sequence_parallel: a mixture-of-experts layer with tp > 1 needs"},
           {"--nproc 2 --set parallel.dp=2 --set parallel.etp=2 --set "
            "model.layer.mlp.moe_ffn_hidden_size=33",
            "spec /model/layer/mlp/moe_ffn_hidden_size: 33 is not divisible by the expert "
            "tensor-parallel size 2"},
           {"--set model.layer.mlp.router.score_function=\\\"softmax\\\" --set "
            "model.layer.mlp.router.enable_expert_bias=true",
            "spec /model/layer/mlp/router/enable_expert_bias: the aux-loss-free expert bias needs "
            "score_function sigmoid"},
       }) {
    auto r = run_loom("train " + q(sp) + " --run-dir " + q(dir_ / "refused") + " " + c.args);
    EXPECT_EQ(r.exit_code, 3) << c.args << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(r.out + r.err, Not(HasSubstr("iter "))) << c.args;  // before any step
    std::printf("%s: %s", c.args.c_str(), r.err.c_str());
  }
}

// `loom bench --trace DIR` writes the pipeline's traced steps as `loom train` does.
TEST_F(PipelineTest, BenchWritesThePipelineTrace) {
  auto r = run_loom("bench " + q(spec("bench.json", pipeline_spec())) +
                    " --nproc 2 --set parallel.pp=2 --steps 2 --warmup 1 --trace " +
                    q(dir_ / "bench_trace"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json trace =
      nlohmann::json::parse(read_file(dir_ / "bench_trace" / "pipeline_trace.json"))["traceEvents"];
  std::map<int, int> forwards;
  for (const nlohmann::json& e : trace)
    if (e["ph"] == "X" && e["cat"] == "forward") ++forwards[e["pid"].get<int>()];
  EXPECT_EQ(forwards[0], 2 * 4);  // steps 2 and 3 (warm-up 1, timed 2) x 4 micro-batches
  EXPECT_EQ(forwards[1], 2 * 4);
  r = run_loom("bench " + q(spec("bench1.json", pipeline_spec())) + " --trace " +
               q(dir_ / "no_trace"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("this run has parallel.pp 1"));
}

// `loom schedule show`: the plan of every rank drawn, and its simulated bubble beside the
// theory, without running anything; a shape the schedule cannot run is refused.
TEST_F(PipelineTest, ScheduleShowDrawsThePlanAndItsBubble) {
  auto r = run_loom("schedule show --pp 4 --micro-batches 8");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::printf("%s", r.out.c_str());
  EXPECT_THAT(r.out, HasSubstr("schedule 1f1b: 4 stages"));
  EXPECT_THAT(r.out, HasSubstr("rank  3 | .  .  .  F0 B0 -  F1 B1 -"));
  EXPECT_THAT(r.out, HasSubstr("bubble: 27.3% of the step simulated, 27.3% in theory"));
  EXPECT_THAT(r.out, HasSubstr("in flight at most, by rank: 4, 3, 2, 1"));
  r = run_loom("schedule show --pp 4 --micro-batches 8 --schedule zb_h1");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("bubble: 11.1% of the step simulated, 11.1% in theory"));
  r = run_loom("schedule show --pp 2 --vpp 2 --micro-batches 4");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("schedule interleaved"));
  EXPECT_THAT(r.out, HasSubstr("11.1% in theory"));
  r = run_loom("schedule show --pp 4 --vpp 2 --micro-batches 6");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("6 micro-batches per step leave 2 after groups of 4"));
  r = run_loom("schedule show --micro-batches 6");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--pp and --micro-batches are required"));
}

// FP8 with a pipeline (delayed scaling, 4 micro-batches a step): each stage quantises its own
// layers with quantisers of its own, whose amaxes are reduced over tp, cp and dp but not pp,
// so pp 2 trains as one rank does, with 1f1b, zb_h1 and interleaved 1f1b (two virtual chunks
// a stage, whose quantisers are two runs of the checkpoint's): the same curve, every
// parameter's gradient of step 1 (1f1b), and the FP8 state to the bit (a checkpoint holds
// the virtual stages' quantisers side by side in the whole model's order: the tensors one
// rank saves). Checkpoints move between the layouts: saved at pp 2 or pp 2 x vpp 2 and
// resumed at pp 1, saved at pp 1 and resumed at pp 2 x vpp 2, each continuing with the
// uninterrupted run's losses (a scale restored to the wrong quantiser would not). The FP8
// weights are kept across the step's micro-batches in every layout. Current scaling (no state
// in its checkpoints) at pp 2 x vpp 2 too.
TEST_F(PipelineTest, Fp8MatchesOneRankAndItsStateReshards) {
  nlohmann::json s = pipeline_spec();
  s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "delayed"}, {"amax_history_len", 2}}}};
  const std::string kept = "weights quantised once a step, kept for its 4 micro-batches";
  Curve one = train("fp8_one", s, "");
  EXPECT_THAT(last_out_, HasSubstr(kept));
  EXPECT_LT(one.loss.back(), one.loss.front() - 0.02);  // it learns
  struct Layout {
    std::string name, args, banner;
  };
  const std::vector<Layout> layouts = {
      {"fp8_pp2", "--nproc 2 --set parallel.pp=2", "pipeline: 1f1b"},
      // Zero-bubble: the weight gradients' GEMMs deferred, the kept W^T read by
      // backward_input.
      {"fp8_pp2zb", "--nproc 2 --set parallel.pp=2 --set parallel.pipeline_schedule.impl=zb_h1",
       "pipeline: zb_h1"},
      {"fp8_pp2vpp2", "--nproc 2 --set parallel.pp=2 --set parallel.vpp=2",
       "pipeline: interleaved"},
  };
  for (const Layout& layout : layouts) {
    Curve c = train(layout.name, s, layout.args);
    EXPECT_THAT(last_out_, HasSubstr(layout.banner)) << layout.name;
    EXPECT_THAT(last_out_, HasSubstr(kept)) << layout.name;
    expect_same_curve(one, c, layout.name);
  }
  loom_names_ = true;  // the f32 master weights
  expect_same_gradients("fp8_one", "fp8_pp2", one.grad_norm[0], kBf16GradTolerance);
  auto a = step_one_checkpoint("fp8_one");
  for (const char* layout : {"fp8_pp2", "fp8_pp2vpp2"}) {
    auto b = step_one_checkpoint(layout);
    for (const char* state :
         {"fp8.amax_history", "fp8.scale", "fp8.scale_inv", "fp8.history_position"}) {
      ASSERT_TRUE(a.count(state) && b.count(state)) << layout << ": " << state;
      EXPECT_EQ(a[state], b[state]) << layout << ": " << state << " against one rank's";
    }
    std::printf("%s: %zu quantisers' amax histories and scales equal to one rank's\n", layout,
                a["fp8.scale"].size());
  }
  for (const auto& [from, to, args] :
       {std::tuple{"fp8_pp2", "fp8_pp1", ""}, std::tuple{"fp8_pp2vpp2", "fp8_pp1_from_vpp", ""},
        std::tuple{"fp8_one", "fp8_pp2vpp2_from_one",
                   "--nproc 2 --set parallel.pp=2 --set parallel.vpp=2"}}) {
    const fs::path ckpts = dir_ / from / "checkpoints";
    fs::remove_all(ckpts / "iter_0000004");  // continue from step 3
    fs::remove_all(ckpts / "iter_0000005");
    expect_resumes_like(s, ckpts, to, args, one);
  }
  // Current scaling keeps no state across steps: its checkpoints hold none to slice.
  nlohmann::json current = s;
  current["precision"]["fp8"] = {{"impl", "tensorwise"}};
  Curve current_one = train("fp8_tensorwise_one", current, "");
  Curve current_vpp = train("fp8_tensorwise_pp2vpp2", current,
                            "--nproc 2 --set parallel.pp=2 --set parallel.vpp=2");
  expect_same_curve(current_one, current_vpp, "tensorwise pp2 vpp2");
}

// Checkpoints move across pipeline layouts: saved at pp 2 (the tied table written once, by
// the first stage), resumed at pp 1, at pp 4, at pp 2 x tp 2 and at pp 2 x dp 2 with the
// distributed optimizer (its states sharded again), each continuing with the uninterrupted
// run's losses.
TEST_F(PipelineTest, CheckpointsReshardAcrossPipelineLayouts) {
  Curve one = train("one", pipeline_spec(), "");
  Curve pp2 = train("pp2", pipeline_spec(), "--nproc 2 --set parallel.pp=2");
  fs::path ckpts = dir_ / "pp2" / "checkpoints";
  ASSERT_TRUE(fs::exists(ckpts / "iter_0000003" / "shards" / "rank_00001.json"));  // 2 writers
  fs::remove_all(ckpts / "iter_0000004");  // continue from step 3
  fs::remove_all(ckpts / "iter_0000005");
  struct Layout {
    std::string name, args;
  };
  for (const Layout& layout :
       {Layout{"pp1", ""}, Layout{"pp4", "--nproc 4 --set parallel.pp=4"},
        Layout{"pp2tp2", "--nproc 4 --set parallel.pp=2 --set parallel.tp=2"},
        Layout{"pp2dp2zero",
               "--nproc 4 --set parallel.pp=2 --set parallel.dp=2 --set "
               "parallel.distributed_optimizer=true"}})
    expect_resumes_like(pipeline_spec(), ckpts, layout.name, layout.args, one);
}

// A rank that dies in the middle of a step: the launcher names it and returns non-zero.
TEST_F(ParallelTest, LauncherStopsWhenARankDies) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 50;
  auto r = run_loom("train " + q(spec("die.json", s)) + " --run-dir " + q(dir_ / "die") +
                        " --nproc 2 --set parallel.dp=2 --set parallel.timeout_s=20",
                    "LOOM_TEST_FAULT=kill:1:3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("rank 1"));
  EXPECT_THAT(r.err, HasSubstr("signal 9")) << r.err;
}

// Ranks started without the launcher (as srun or mpirun start them): when one dies, the
// other stops on its own with a message naming the operation, well within the timeout.
TEST_F(ParallelTest, SurvivorStopsWhenAPeerDies) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 50;
  TwoRanks r = two_ranks_with_a_fault("peer", s, "--set parallel.dp=2 --set parallel.timeout_s=60",
                                      "kill:1:3");
  EXPECT_EQ(r.code1, -SIGKILL);
  EXPECT_EQ(r.code0, 6) << r.err0;  // training failed while running
  EXPECT_THAT(r.err0, HasSubstr("dp")) << r.err0;
  EXPECT_LT(r.seconds, 60.0) << r.err0;  // the timeout (ASan builds start slowly)
}

// A pipeline stage that dies mid-step: the other stage, waiting for a gradient or sending an
// activation, stops naming the pipeline group and the dead rank; its send threads end with it.
TEST_F(ParallelTest, APipelineStageThatDiesStopsTheOther) {
  EXPECT_THAT(survivor_of_a_kill("pp_die", pipeline_spec(), "--set parallel.pp=2", "pp/0"),
              HasSubstr("pipeline schedule '1f1b'"));
}

// A context-parallel rank killed mid-step: the other stops at its next ring transfer (or the
// loss's reduction), naming the context-parallel group and the dead rank.
TEST_F(ParallelTest, AContextParallelRankThatDiesStopsTheOther) {
  EXPECT_THAT(survivor_of_a_kill("cp_die", pipeline_spec(), "--set parallel.cp=2", "cp/0"),
              HasSubstr("context-parallel attention"));
}

// A stage that fails with an error in the middle of a step (a receive of its own posted
// ahead, never to be filled): both stages end, each with its message, within the
// collective timeout (no hang). How long the other stage takes to notice varies (from
// about 2 s to the timeout in our runs: see the closing note of issue 19), so the claim is
// the timeout's.
TEST_F(ParallelTest, APipelineStageThatFailsStopsBothWithinTheTimeout) {
  nlohmann::json s = pipeline_spec();
  s["train"]["steps"] = 50;
  s["checkpoint"] = {{"save_at_end", false}};
  TwoRanks r = two_ranks_with_a_fault(
      "pp_throw", s, "--set parallel.pp=2 --set parallel.timeout_s=15", "throw:1:3");
  std::printf("after %.1f s:\n  rank 0: %s  rank 1: %s", r.seconds, r.err0.c_str(), r.err1.c_str());
  EXPECT_NE(r.code1, 0);
  EXPECT_THAT(r.err1, HasSubstr("LOOM_TEST_FAULT: rank 1 fails at step 3")) << r.err1;
  EXPECT_EQ(r.code0, 6) << r.err0;
  EXPECT_THAT(r.err0, HasSubstr("group 'pp/0'")) << r.err0;
  EXPECT_LT(r.seconds, 60.0) << "the 15 s timeout (and start-up) passed";
}

// A rank that stops answering (alive, stuck): the others time out, naming the operation.
TEST_F(ParallelTest, StuckPeerTimesOut) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 50;
  fs::path sp = spec("stuck.json", s);
  fs::path rdzv = dir_ / "rdzv_stuck";
  std::vector<testing::Background> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(testing::start_loom("train " + q(sp) + " --run-dir " + q(dir_ / "stuck") +
                                            " --set parallel.dp=2 --set parallel.timeout_s=8",
                                        "LOOM_RANK=" + std::to_string(rank) +
                                            " LOOM_WORLD_SIZE=2 LOOM_RDZV=" + q(rdzv) +
                                            " LOOM_RUN_ID=stuck LOOM_TEST_FAULT=hang:1:3"));
  auto t0 = std::chrono::steady_clock::now();
  int code0 = testing::wait_loom(ranks[0]);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill(ranks[1].pid, SIGKILL);
  testing::wait_loom(ranks[1]);
  std::string err = read_file(ranks[0].err);
  EXPECT_EQ(code0, 6) << err;
  EXPECT_THAT(err, HasSubstr("timed out")) << err;
  EXPECT_LT(seconds, 60.0) << err;
}

// Every rank must load the same plugin files: a rank whose optimizer plugin differs (a
// rebuilt library) refuses to start, and so does every other rank.
TEST_F(ParallelTest, RanksWithDifferentPluginsRefuseToStart) {
  nlohmann::json s = tiny_spec();
  fs::path sp = spec("plugins.json", s);
  // The optimizer plugin as installed, and a copy with one more byte (another build).
  fs::path installed = fs::absolute("plugins/optim");  // runfiles
  fs::path other = dir_ / "other_plugins" / "optim";
  fs::create_directories(other);
  for (const auto& entry : fs::directory_iterator(installed))
    fs::copy_file(entry.path(), other / entry.path().filename());
  {
    std::ofstream so(other / "libloom_optim.so", std::ios::app | std::ios::binary);
    so << '\0';
  }
  fs::path rdzv = dir_ / "rdzv_plugins";
  std::vector<testing::Background> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(testing::start_loom(
        "train " + q(sp) + " --run-dir " + q(dir_ / "plugins_run") +
            " --set parallel.dp=2 --set parallel.timeout_s=20" +
            (rank == 1 ? " --plugin-path " + q(other.parent_path()) : std::string()),
        "LOOM_RANK=" + std::to_string(rank) + " LOOM_WORLD_SIZE=2 LOOM_RDZV=" + q(rdzv) +
            " LOOM_RUN_ID=plugins"));
  for (int rank = 0; rank < 2; ++rank) {
    int code = testing::wait_loom(ranks[rank]);
    std::string err = read_file(ranks[rank].err);
    EXPECT_EQ(code, 6) << err;
    EXPECT_THAT(err, HasSubstr("rank 1 differs from rank 0 in plugins: plugin 'optim'")) << err;
  }
}

// Ranks that resolved different specs (here one rank was given another learning rate, as a
// rank of a hand-written job script might be) refuse to start, naming the rank and the
// difference.
TEST_F(ParallelTest, RanksWithDifferentSpecsRefuseToStart) {
  fs::path sp = spec("specs.json", tiny_spec());
  fs::path rdzv = dir_ / "rdzv_specs";
  std::vector<testing::Background> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(
        testing::start_loom("train " + q(sp) + " --run-dir " + q(dir_ / "specs_run") +
                                " --set parallel.dp=2 --set parallel.timeout_s=20" +
                                (rank == 1 ? " --set optimizer.lr=0.02" : std::string()),
                            "LOOM_RANK=" + std::to_string(rank) +
                                " LOOM_WORLD_SIZE=2 LOOM_RDZV=" + q(rdzv) + " LOOM_RUN_ID=specs"));
  for (int rank = 0; rank < 2; ++rank) {
    int code = testing::wait_loom(ranks[rank]);
    std::string err = read_file(ranks[rank].err);
    std::printf("rank %d: exit %d: %s", rank, code, err.c_str());
    EXPECT_EQ(code, 6) << err;
    EXPECT_THAT(err, HasSubstr("rank 1 differs from rank 0 in")) << err;
    EXPECT_THAT(err, HasSubstr("lr")) << err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "specs_run" / "metrics.jsonl") &&
               !read_file(dir_ / "specs_run" / "metrics.jsonl").empty())
      << "no step may run";
}

// The complete lines of a metrics file being written that carry a training loss.
size_t logged_steps(const fs::path& metrics) {
  std::string text = read_file(metrics);
  size_t count = 0, begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1)
    if (text.substr(begin, end - begin).find("\"loss\":") != std::string::npos) ++count;
  return count;
}

// The last step a rank's debug log reports ("step S: K of N gradient buckets ..."), or -1.
int64_t last_step_logged(const std::string& log) {
  std::regex line("step ([0-9]+): [0-9]+ of [0-9]+ gradient buckets");
  int64_t last = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it)
    last = std::stoll((*it)[1].str());
  return last;
}

// SIGTERM to one rank (ranks started without the launcher, as by srun) or to the launcher
// (which passes it to every rank): every rank finishes the same step (the last one each
// logs), they save one checkpoint of that step together (tp 2: each rank writes its
// slices), rank 0 says where they stopped, and all exit 0.
TEST_F(ParallelTest, SigtermStopsEveryRankAfterTheSameStepAndSavesTogether) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 100000;
  s["train"]["eval_interval"] = 100000;
  s["checkpoint"] = {{"interval", 1000000}, {"save_at_end", false}};
  const std::string layout = " --set parallel.tp=2 --set log.level=debug";
  auto wait_for_steps = [](const fs::path& metrics) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (logged_steps(metrics) < 3 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GE(logged_steps(metrics), 3u);
  };
  // logs[r]: rank r's output (stdout and stderr).
  auto expect_saved_together = [](const fs::path& run, const std::vector<std::string>& logs,
                                  const std::string& how) {
    std::string latest = read_file(run / "checkpoints" / "latest");
    ASSERT_EQ(latest.rfind("iter_", 0), 0u) << how << ": " << latest;
    int64_t saved = std::stoll(latest.substr(5));
    std::printf("%s: checkpoint %s; last steps of the ranks: %lld, %lld\n", how.c_str(),
                latest.substr(0, latest.size() - 1).c_str(),
                static_cast<long long>(last_step_logged(logs[0])),
                static_cast<long long>(last_step_logged(logs[1])));
    EXPECT_THAT(logs[0],
                HasSubstr("stopped by SIGTERM at iteration " + std::to_string(saved) + ";"))
        << how << ":\n"
        << logs[0];
    fs::path ckpt = run / "checkpoints" / latest.substr(0, latest.size() - 1);
    EXPECT_EQ(nlohmann::json::parse(read_file(ckpt / "metadata.json"))["loom"]["iteration"], saved)
        << how;
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(last_step_logged(logs[r]), saved) << how << ", rank " << r << ":\n" << logs[r];
      fs::path index = ckpt / "shards" / ("rank_0000" + std::to_string(r) + ".json");
      ASSERT_TRUE(fs::exists(index)) << how << ": " << index;
      EXPECT_GT(nlohmann::json::parse(read_file(index))["bin_size"].get<int64_t>(), 0)
          << how << ": rank " << r << " wrote its slices";
    }
    EXPECT_EQ(logged_steps(run / "metrics.jsonl"), static_cast<size_t>(saved)) << how;
  };
  {  // Ranks started by hand; only rank 1 is signalled.
    fs::path sp = spec("term.json", s), run = dir_ / "term";
    std::vector<testing::Background> ranks;
    for (int rank = 0; rank < 2; ++rank)
      ranks.push_back(testing::start_loom(
          "train " + q(sp) + " --run-dir " + q(run) + layout,
          "LOOM_RANK=" + std::to_string(rank) +
              " LOOM_WORLD_SIZE=2 LOOM_RDZV=" + q(dir_ / "rdzv_term") + " LOOM_RUN_ID=term"));
    wait_for_steps(run / "metrics.jsonl");
    ::kill(ranks[1].pid, SIGTERM);
    std::vector<std::string> logs;
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(testing::wait_loom(ranks[rank]), 0) << read_file(ranks[rank].err);
      logs.push_back(read_file(ranks[rank].out) + read_file(ranks[rank].err));
    }
    expect_saved_together(run, logs, "SIGTERM to rank 1");
  }
  {  // The launcher: its output has both ranks' lines, prefixed "[rank R] ".
    fs::path run = dir_ / "term_launcher";
    testing::Background launcher =
        testing::start_loom("train " + q(spec("term_launcher.json", s)) + " --run-dir " + q(run) +
                            " --nproc 2" + layout);
    wait_for_steps(run / "metrics.jsonl");
    ::kill(launcher.pid, SIGTERM);
    EXPECT_EQ(testing::wait_loom(launcher), 0) << read_file(launcher.err);
    std::string all = read_file(launcher.out) + read_file(launcher.err);
    std::vector<std::string> logs;
    for (int rank = 0; rank < 2; ++rank) {
      std::string prefix = "[rank " + std::to_string(rank) + "] ", mine;
      std::stringstream lines(all);
      for (std::string line; std::getline(lines, line);)
        if (line.rfind(prefix, 0) == 0) mine += line + "\n";
      logs.push_back(mine);
    }
    expect_saved_together(run, logs, "SIGTERM to the launcher");
  }
}

TEST_F(ParallelTest, LayoutsThatDoNotFitAreRefusedBeforeStart) {
  fs::path sp = spec("layout.json", tiny_spec());
  auto r = run_loom("train " + q(sp) + " --nproc 2 --set parallel.dp=3");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("tp x cp x ep x dp x pp = 1 x 1 x 1 x 3 x 1 = 3 ranks, but 2 were "
                               "started"));
  r = run_loom("train " + q(sp) + " --set parallel.dp=2");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--nproc 2"));
  r = run_loom("train " + q(sp) +
               " --nproc 2 --set parallel.dp=2 --set "
               "train.global_batch_size=6");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("is not a multiple of micro_batch_size x dp = 2 x 2"));
  // Context parallelism cuts each sequence into 2 cp equal chunks.
  r = run_loom("train " + q(sp) + " --nproc 3 --set parallel.cp=3");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/train/seq_length: 16 is not divisible by 2 x parallel.cp = 6"));
  // Pipeline stages the model or the schedule cannot make.
  for (auto [layout, rule] : std::vector<std::pair<std::string, std::string>>{
           {"Et|t|L", "'Et|t|L' has 3 stages, not a multiple of parallel.pp 2"},
           {"Et|tx|L|", "has 'x': the symbols are E (embedding), t (decoder layer)"},
           {"Et|tt||", "must end with L (the loss) and hold it once"},
           {"Et|ttL", "places 3 decoder layers (t), but the model has 2"}}) {
    r = run_loom("train " + q(sp) +
                 " --nproc 2 --set parallel.pp=2 --set 'parallel.pipeline_layout=\"" + layout +
                 "\"'");
    EXPECT_EQ(r.exit_code, 3) << layout << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(rule)) << layout;
  }
  r = run_loom(
      "train " + q(sp) +
      " --nproc 2 --set parallel.pp=2 --set "
      "'parallel.pipeline_layout=\"Et|tL\"' --set parallel.num_layers_in_first_pipeline_stage=1");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot be combined with parallel.pipeline_layout"));
  r = run_loom("train " + q(sp) + " --nproc 4 --set parallel.pp=4");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 layers do not split evenly over 4 pipeline stages"));
  r = run_loom("train " + q(sp) +
               " --nproc 2 --set parallel.pp=2 --set parallel.vpp=2 "
               "--set model.num_layers=4 --set train.global_batch_size=6");
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("3 micro-batches per step leave 1 after groups of 2"));
  r = run_loom("train " + q(sp) +
               " --nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set "
               "train.seq_length=15");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/train/seq_length: 15 is not divisible by parallel.tp 2"));
  // What the model splits: heads, key/value groups, the MLP's units. (A vocabulary tp does
  // not divide is padded: PaddedVocabularyTrainsAsTheUnpadded.)
  for (auto [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"num_attention_heads", "3"}, {"num_query_groups", "1"}, {"ffn_hidden_size", "33"}}) {
    r = run_loom("train " + q(sp) + " --nproc 2 --set parallel.tp=2 --set model." + key + "=" +
                 value + (key == "num_attention_heads" ? " --set model.kv_channels=8" : ""));
    EXPECT_EQ(r.exit_code, 3) << key << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("/model/" + key + ": " + value +
                                 " is not divisible by the tensor-parallel size 2"))
        << r.err;
  }
  r = run_loom("train " + q(sp) + " --nproc 0");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
}

}  // namespace
}  // namespace loom
