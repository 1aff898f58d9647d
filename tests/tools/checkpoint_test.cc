// Checkpoints end to end through `loom train` and `loom checkpoint`: a run killed with
// SIGKILL at a random step (or inside a save) and resumed gives bit-identical losses to an
// uninterrupted one; SIGTERM saves and exits 0; damaged checkpoints are reported and
// skipped; keep-last-K; inspect and convert.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using ::testing::HasSubstr;
using testing::read_file;
using testing::run_loom;
using testing::write_file;

constexpr int kOk = 0;

nlohmann::json tiny_spec(int steps) {
  nlohmann::json spec = nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "vocab_size": 64, "max_position_embeddings": 32, "hidden_dropout": 0.1,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "lr_schedule": {"impl": "cosine", "warmup_steps": 5},
    "data": {"mock": true},
    "train": {"micro_batch_size": 4, "global_batch_size": 8, "seq_length": 16,
              "log_interval": 1, "eval_interval": 10, "eval_steps": 2}
  })");
  spec["train"]["steps"] = steps;
  return spec;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// step -> loss (the last line written for a step wins) and step -> validation loss.
std::map<int64_t, double> losses(const fs::path& metrics, const char* key = "loss") {
  std::map<int64_t, double> out;
  std::stringstream lines(read_file(metrics));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key) && j[key].is_number()) out[j["step"].get<int64_t>()] = j[key].get<double>();
  }
  return out;
}

int64_t metric_lines(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) n += line.find("\"loss\"") != std::string::npos;
  return n;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_dir("checkpoint_test"); }

  fs::path spec(const std::string& name, const nlohmann::json& body) {
    fs::path p = dir_ / name;
    write_file(p, body.dump(2));
    return p;
  }
  // `loom train` of `body` into dir_/name (run dir) with checkpoints in dir_/name/ckpt.
  std::string train_args(const std::string& name, const nlohmann::json& body) {
    return "train " + q(spec(name + ".json", body)) + " --run-dir " + q(dir_ / name);
  }
  // The uninterrupted reference run: its losses by step.
  std::map<int64_t, double> reference(const nlohmann::json& body) {
    auto r = run_loom(train_args("reference", body));
    EXPECT_EQ(r.exit_code, kOk) << r.out << r.err;
    return losses(dir_ / "reference" / "metrics.jsonl");
  }
  fs::path dir_;
};

void expect_same_losses(const std::map<int64_t, double>& want,
                        const std::map<int64_t, double>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << "step " << step;
    EXPECT_EQ(got.at(step), loss) << "step " << step << " (bit-identical expected)";
  }
}

TEST_F(CheckpointTest, KilledAtARandomStepResumesBitIdentically) {
  nlohmann::json body = tiny_spec(30);
  body["checkpoint"] = {{"interval", 1}, {"resume", "auto"}, {"async", true}, {"keep", 2}};
  std::map<int64_t, double> want = reference(body);
  ASSERT_EQ(want.size(), 30u);

  std::random_device device;
  unsigned seed = device();
  std::mt19937 rng(seed);
  int64_t kill_after = std::uniform_int_distribution<int64_t>(2, 27)(rng);
  SCOPED_TRACE("kill after step " + std::to_string(kill_after) + " (seed " + std::to_string(seed) +
               ")");
  // A little jitter so the kill lands anywhere in a step or a save.
  int64_t jitter_us = std::uniform_int_distribution<int64_t>(0, 3000)(rng);

  fs::path run = dir_ / "killed";
  testing::Background p = testing::start_loom(train_args("killed", body));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (metric_lines(run / "metrics.jsonl") < kill_after &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::microseconds(jitter_us));
  ::kill(p.pid, SIGKILL);
  int code = testing::wait_loom(p);
  if (code != -SIGKILL) GTEST_SKIP() << "the run finished before the kill (exit " << code << ")";

  auto r = run_loom(train_args("killed", body));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  // Saves are asynchronous: a kill early in the run (a slow ASan build, steps of a few
  // milliseconds) can land before the first save is durable, and the run then starts over.
  // Either way the losses must be the uninterrupted run's.
  EXPECT_THAT(r.out,
              ::testing::AnyOf(HasSubstr("resume: iteration "), HasSubstr("no checkpoint in")));
  expect_same_losses(want, losses(run / "metrics.jsonl"));
  expect_same_losses(losses(dir_ / "reference" / "metrics.jsonl", "valid_loss"),
                     losses(run / "metrics.jsonl", "valid_loss"));
}

// FP8 delayed scaling carries amax histories and scales from step to step: a checkpoint
// keeps them (fp8.amax_history, ...), so a resumed run quantises exactly as the
// uninterrupted one. A checkpoint without them resumes with fresh histories and says so.
TEST_F(CheckpointTest, Fp8RecipeStateResumesBitIdentically) {
  testing::WithoutLeakCheck no_leak_scan;  // its runs crash LeakSanitizer's tracer (see there)
  nlohmann::json body = tiny_spec(8);
  body["lr_schedule"] = {{"impl", "constant"},
                         {"warmup_steps", 2}};  // the same LR for 4 or 8 steps
  body["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "delayed"}, {"amax_history_len", 3}}}};
  body["checkpoint"] = {{"resume", "auto"}};
  std::map<int64_t, double> want = reference(body);
  ASSERT_EQ(want.size(), 8u);

  nlohmann::json first = body;
  first["train"]["steps"] = 4;
  auto r = run_loom(train_args("resumed", first));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  r = run_loom(train_args("resumed", body));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("resume: iteration 4"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("holds no FP8 recipe state")));
  expect_same_losses(want, losses(dir_ / "resumed" / "metrics.jsonl"));

  // Saved without FP8, resumed with it: a warning, and training goes on.
  nlohmann::json plain = first;
  plain["precision"] = {{"params", "bf16"}};
  r = run_loom(train_args("plain", plain));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  r = run_loom(train_args("plain", body));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("holds no FP8 recipe state"));
}

TEST_F(CheckpointTest, KilledInsideASaveKeepsThePreviousCheckpoint) {
  nlohmann::json body = tiny_spec(12);
  body["checkpoint"] = {{"interval", 2}, {"resume", "auto"}};
  std::map<int64_t, double> want = reference(body);
  for (const char* point : {"written", "renamed"}) {
    SCOPED_TRACE(point);
    std::string name = std::string("fault_") + point;
    fs::path ckpt = dir_ / name / "checkpoints";
    auto killed =
        run_loom(train_args(name, body), std::string("LOOM_CHECKPOINT_FAULT=") + point + ":6");
    EXPECT_NE(killed.exit_code, kOk);
    EXPECT_EQ(read_file(ckpt / "latest"), "iter_0000004\n");
    EXPECT_TRUE(fs::exists(ckpt / "iter_0000004" / "metadata.json"));
    // "written": a half-made save is left under a temporary name; "renamed": iter_6 is whole.
    EXPECT_EQ(fs::exists(ckpt / "iter_0000006"), std::string(point) == "renamed");
    auto r = run_loom(train_args(name, body));
    ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr(std::string(point) == "renamed" ? "resume: iteration 6"
                                                                 : "resume: iteration 4"));
    for (const auto& entry : fs::directory_iterator(ckpt))
      EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
    expect_same_losses(want, losses(dir_ / name / "metrics.jsonl"));
  }
}

TEST_F(CheckpointTest, SigtermFinishesTheStepSavesAndExitsZero) {
  nlohmann::json body = tiny_spec(100000);
  body["checkpoint"] = {{"resume", "auto"}};
  fs::path run = dir_ / "term";
  testing::Background p = testing::start_loom(train_args("term", body));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (metric_lines(run / "metrics.jsonl") < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(p.pid, SIGTERM);
  ASSERT_EQ(testing::wait_loom(p), kOk) << read_file(p.err);
  std::string out = read_file(p.out);
  EXPECT_THAT(out, HasSubstr("stopped by SIGTERM at iteration "));
  std::string latest = read_file(run / "checkpoints" / "latest");
  ASSERT_FALSE(latest.empty());
  int64_t saved = std::stoll(latest.substr(5));
  EXPECT_THAT(out, HasSubstr("at iteration " + std::to_string(saved) + ";"));
  EXPECT_GE(saved, 3);
  // The run continues from there.
  body["train"]["steps"] = saved + 2;
  auto r = run_loom(train_args("term", body));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("resume: iteration " + std::to_string(saved)));
  EXPECT_THAT(r.out, HasSubstr("done: " + std::to_string(saved + 2) + " steps"));
}

// Damage of each kind to the newest checkpoint: resume falls back to the one before and says
// which file and tensor were wrong.
TEST_F(CheckpointTest, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  nlohmann::json body = tiny_spec(10);
  body["checkpoint"] = {{"interval", 5}, {"resume", "auto"}};
  std::map<int64_t, double> want = reference(body);
  struct Damage {
    const char* name;
    void (*apply)(const fs::path& dir);
    const char* message;
  };
  const Damage damages[] = {
      {"bit flip",
       [](const fs::path& d) {
         std::fstream f(d / "shards" / "rank_00000.bin",
                        std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(100);
         char c = 0;
         f.read(&c, 1);
         c ^= 0x10;
         f.seekp(100);
         f.write(&c, 1);
       },
       "rank_00000.bin"},
      {"truncated shard",
       [](const fs::path& d) {
         fs::resize_file(d / "shards" / "rank_00000.bin",
                         fs::file_size(d / "shards" / "rank_00000.bin") / 2);
       },
       "rank_00000.bin"},
      {"missing index", [](const fs::path& d) { fs::remove(d / "shards" / "rank_00000.json"); },
       "rank_00000.json"},
      {"bad metadata",
       [](const fs::path& d) {
         std::string m = read_file(d / "metadata.json");
         m[m.size() / 2] = m[m.size() / 2] == '1' ? '2' : '1';
         write_file(d / "metadata.json", m);
       },
       "metadata.json"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    std::string name = std::string("damage_") + std::to_string(&damage - damages);
    fs::path ckpt = dir_ / name / "checkpoints";
    nlohmann::json first = body;
    first["train"]["steps"] = 10;
    auto r = run_loom(train_args(name, first));
    ASSERT_EQ(r.exit_code, kOk) << r.err;
    damage.apply(ckpt / "iter_0000010");
    // The damage is reported by inspect --verify (or by opening the checkpoint).
    auto inspect = run_loom("checkpoint inspect " + q(ckpt / "iter_0000010") + " --verify");
    EXPECT_NE(inspect.exit_code, kOk);
    EXPECT_THAT(inspect.err + inspect.out, HasSubstr(damage.message));
    // Resume skips it, says so, and keeps it aside.
    nlohmann::json more = body;
    more["train"]["steps"] = 10;
    r = run_loom(train_args(name, more));
    ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("cannot resume from"));
    EXPECT_THAT(r.err, HasSubstr(damage.message));
    EXPECT_THAT(r.out, HasSubstr("resume: iteration 5"));
    EXPECT_TRUE(fs::exists(ckpt / "iter_0000010.unusable"));
    expect_same_losses(want, losses(dir_ / name / "metrics.jsonl"));
  }
}

TEST_F(CheckpointTest, ADifferentModelIsRefusedNamingTheTensor) {
  nlohmann::json body = tiny_spec(8);
  body["checkpoint"] = {{"resume", "auto"}};
  auto r = run_loom(train_args("shape", body));
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  body["model"]["hidden_size"] = 64;
  r = run_loom(train_args("shape", body));
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("none of the 1 checkpoints"));
  EXPECT_THAT(r.err, HasSubstr("model.embedding.word_embeddings.weight"));
  EXPECT_THAT(r.err, HasSubstr("[64,32]"));
  size_t error = r.err.find("loom train: error: ");
  ASSERT_NE(error, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n', error), r.err.size() - 1) << "one line: " << r.err;
}

TEST_F(CheckpointTest, KeepsTheLastK) {
  nlohmann::json body = tiny_spec(6);
  body["checkpoint"] = {{"interval", 1}, {"keep", 2}};
  auto r = run_loom(train_args("keep", body));
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "keep" / "checkpoints"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000005", "iter_0000006", "latest"}));
}

TEST_F(CheckpointTest, InspectConvertAndInitFrom) {
  nlohmann::json body = tiny_spec(8);
  auto r = run_loom(train_args("conv", body));
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  fs::path ckpt = dir_ / "conv" / "checkpoints";
  auto inspect = run_loom("checkpoint inspect " + q(ckpt) + " --verify");
  ASSERT_EQ(inspect.exit_code, kOk) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("iter_0000008"));
  EXPECT_THAT(inspect.out, HasSubstr("<- latest"));
  EXPECT_THAT(inspect.out, HasSubstr("format: sharded, iteration 8"));
  EXPECT_THAT(inspect.out, HasSubstr("optim.exp_avg.decoder.layers.0.mlp.linear_fc1.weight"));
  EXPECT_THAT(inspect.out, HasSubstr("ok"));
  nlohmann::json other = body;
  other["model"]["num_layers"] = 3;
  auto diff = run_loom("checkpoint inspect " + q(ckpt) + " --spec " + q(spec("other.json", other)));
  ASSERT_EQ(diff.exit_code, kOk) << diff.err;
  EXPECT_THAT(diff.out, HasSubstr("/model/num_layers: 2 -> 3"));

  fs::path hf = dir_ / "hf";
  auto conv = run_loom("checkpoint convert " + q(ckpt) + " " + q(hf) + " --to safetensors");
  ASSERT_EQ(conv.exit_code, kOk) << conv.err;
  EXPECT_THAT(conv.out, HasSubstr("optimizer tensors left out"));
  EXPECT_TRUE(fs::exists(hf / "config.json"));
  EXPECT_TRUE(fs::exists(hf / "model.safetensors"));
  nlohmann::json config = nlohmann::json::parse(read_file(hf / "config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  auto again = run_loom("checkpoint convert " + q(ckpt) + " " + q(hf) + " --to safetensors");
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_THAT(again.err, HasSubstr("exists and is not empty"));

  fs::path back = dir_ / "back";
  conv = run_loom("checkpoint convert " + q(hf) + " " + q(back) + " --to sharded");
  ASSERT_EQ(conv.exit_code, kOk) << conv.err;
  inspect = run_loom("checkpoint inspect " + q(back) + " --json");
  ASSERT_EQ(inspect.exit_code, kOk) << inspect.err;
  nlohmann::json d = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(d["checkpoint"]["format"], "sharded");
  EXPECT_EQ(d["checkpoint"]["optimizer_bytes"], 0);

  // Training from the converted weights: the first loss equals the loss the source run
  // would see on the same batch after its 8 steps (init_from keeps weights only).
  nlohmann::json fine = body;
  fine["checkpoint"] = {{"init_from", back.string()}};
  r = run_loom(train_args("fine", fine));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("init: model weights from"));
  nlohmann::json resumed = body;
  resumed["checkpoint"] = {{"init_from", ckpt.string()}};
  auto r2 = run_loom(train_args("fine2", resumed));
  ASSERT_EQ(r2.exit_code, kOk) << r2.err;
  // The same weights through two formats give the same first loss.
  EXPECT_EQ(losses(dir_ / "fine" / "metrics.jsonl").at(1),
            losses(dir_ / "fine2" / "metrics.jsonl").at(1));
}

TEST_F(CheckpointTest, BadArgumentsAreOneLine) {
  auto r = run_loom("checkpoint");
  EXPECT_EQ(r.exit_code, 2);
  r = run_loom("checkpoint inspect " + q(dir_ / "nothing"));
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_THAT(r.err, HasSubstr("no such file or directory"));
  r = run_loom("checkpoint inspect " + q(dir_));
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_THAT(r.err, HasSubstr("not a checkpoint in any known format"));
  r = run_loom("checkpoint convert a b");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--to is required"));
  r = run_loom("checkpoint convert a b --to zip");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("unknown checkpoint format 'zip'"));
}

}  // namespace
}  // namespace loom
