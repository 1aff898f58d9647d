// /train/cuda_graph "forward_backward" end to end on the fake CUDA device
// (tests/plugins/fake_cuda), whose graphs behave as CUDA stream capture does: captured work
// is recorded, not run, and a replay runs it again on the same addresses with the same
// arguments; host copies and synchronize are refused while capturing. A graphed run must
// therefore give the direct run's losses and gradient norms to the bit, at every step: a
// value the capture froze (a loss scale, a batch left in a stale buffer), work run at the
// capture as well as at the replay (gradients counted twice), or memory the graph shares
// with the rest of the step would show. And what cannot be replayed is refused with the
// reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using ::testing::HasSubstr;
using testing::read_file;
using testing::run_loom;
using testing::write_file;

nlohmann::json tiny_spec(int64_t steps) {
  nlohmann::json s = nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "vocab_size": 64, "max_position_embeddings": 32,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "lr_schedule": {"impl": "cosine", "warmup_steps": 2},
    "data": {"mock": true},
    "train": {"micro_batch_size": 2, "seq_length": 16, "log_interval": 1, "device": "cuda",
              "eval_interval": 3, "eval_steps": 1, "global_batch_size": 4,
              "cuda_graph_warmup_steps": 2},
    "kernels": {"libraries": ["testfakecuda"]}
  })");
  s["train"]["steps"] = steps;
  return s;
}

class CudaGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("cuda_graph_test");
    testing::install_test_plugin(dir_ / "plugins", "fake_cuda", "testfakecuda");
  }
  testing::WithoutLeakCheck no_leak_scan_;  // as device_test: bf16 runs and LSan's tracer
  std::string env() const { return "LOOM_PLUGIN_PATH='" + (dir_ / "plugins").string() + "'"; }
  testing::RunResult train(const std::string& name, const nlohmann::json& body) {
    fs::path spec = dir_ / (name + ".json");
    write_file(spec, body.dump(2));
    return run_loom("train '" + spec.string() + "' --run-dir '" + (dir_ / name).string() + "'",
                    env());
  }
  struct Curve {
    std::map<int64_t, std::pair<double, double>> steps;  // step -> (loss, grad norm)
    std::vector<double> valid;
    std::vector<int64_t> skipped;  // steps without an update (non-finite gradients)
  };
  Curve curve(const std::string& name) {
    Curve c;
    std::stringstream lines(read_file(dir_ / name / "metrics.jsonl"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      nlohmann::json m = nlohmann::json::parse(line);
      // A step without an update logs its loss and norm as null (NaN here).
      auto number = [&](const char* key) {
        return m[key].is_null() ? std::nan("") : m[key].get<double>();
      };
      if (m.contains("loss"))
        c.steps[m["step"].get<int64_t>()] = {number("loss"), number("grad_norm")};
      if (m.value("skipped", 0) > 0) c.skipped.push_back(m["step"].get<int64_t>());
      if (m.contains("valid_loss")) c.valid.push_back(m["valid_loss"].get<double>());
    }
    return c;
  }
  // Direct and graphed runs must agree to the bit at every step (the same kernels on the
  // same inputs); prints both for the record.
  void expect_same(const std::string& direct, const std::string& graphed, size_t steps) {
    Curve a = curve(direct), b = curve(graphed);
    ASSERT_EQ(a.steps.size(), steps);
    ASSERT_EQ(b.steps.size(), steps);
    for (const auto& [step, lg] : a.steps) {
      std::printf("%s step %lld: loss %.9g / %.9g, grad norm %.9g / %.9g\n", graphed.c_str(),
                  static_cast<long long>(step), lg.first, b.steps.at(step).first, lg.second,
                  b.steps.at(step).second);
      auto same = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
      EXPECT_TRUE(same(b.steps.at(step).first, lg.first)) << graphed << ": loss at step " << step;
      EXPECT_TRUE(same(b.steps.at(step).second, lg.second))
          << graphed << ": grad norm at step " << step;
    }
    EXPECT_EQ(a.valid, b.valid) << graphed;
    EXPECT_EQ(a.skipped, b.skipped) << graphed;
  }
  fs::path dir_;
};

// Direct and graphed runs of the same spec: two direct steps, then a capture and replays of
// two micro-batches per step, with evaluation (direct, beside the graph's memory) every
// third step. f16 has a dynamic loss scale, here doubled after every step, which the
// replays must read afresh.
TEST_F(CudaGraphTest, GraphedStepsGiveTheDirectLossesAndGradientNorms) {
  for (const char* params : {"f32", "bf16", "f16"}) {
    SCOPED_TRACE(params);
    nlohmann::json body = tiny_spec(7);
    body["precision"] = {{"params", params}};
    if (std::string(params) == "f16") {
      body["precision"]["initial_loss_scale"] = 256;
      body["precision"]["loss_scale_window"] = 1;
    }
    const std::string name = params;
    auto direct = train(name + "_direct", body);
    ASSERT_EQ(direct.exit_code, 0) << direct.out << direct.err;
    EXPECT_THAT(direct.out + direct.err, ::testing::Not(HasSubstr("cuda graph")));
    body["train"]["cuda_graph"] = "forward_backward";
    auto graphed = train(name + "_graphed", body);
    ASSERT_EQ(graphed.exit_code, 0) << graphed.out << graphed.err;
    EXPECT_THAT(graphed.out + graphed.err,
                HasSubstr("step 3: capturing the forward and backward after 2 direct steps"));
    expect_same(name + "_direct", name + "_graphed", 7);
    EXPECT_EQ(curve(name + "_direct").valid.size(), 3u);
  }
}

// With one micro-batch a step, the captured pass overwrites the weight gradients' first writes
// (grad_first_write) as a direct step does, and every replay does so again, over gradients
// the trainer no longer zero-fills: the graphed run keeps the direct run's bits, also when
// those gradients hold NaN before each step (LOOM_TEST_FAULT=poison_overwrite from step 1;
// the capture is at step 3). With two
// micro-batches a step the graph adds at every write (one graph serves both), which the test
// above checks against the direct run.
TEST_F(CudaGraphTest, OneMicroBatchAStepOverwritesTheFirstWritesInTheGraphToo) {
  nlohmann::json body = tiny_spec(5);
  body["train"]["global_batch_size"] = 2;  // one micro-batch of 2
  auto direct = train("one_direct", body);
  ASSERT_EQ(direct.exit_code, 0) << direct.out << direct.err;
  body["train"]["cuda_graph"] = "forward_backward";
  auto graphed = train("one_graphed", body);
  ASSERT_EQ(graphed.exit_code, 0) << graphed.out << graphed.err;
  fs::path spec = dir_ / "one_poisoned.json";
  write_file(spec, body.dump(2));
  auto poisoned =
      run_loom("train '" + spec.string() + "' --run-dir '" + (dir_ / "one_poisoned").string() + "'",
               env() + " LOOM_TEST_FAULT=poison_overwrite:0:1");
  ASSERT_EQ(poisoned.exit_code, 0) << poisoned.out << poisoned.err;
  EXPECT_THAT(poisoned.err, HasSubstr("LOOM_TEST_FAULT: poison_overwrite"));
  expect_same("one_direct", "one_graphed", 5);
  expect_same("one_direct", "one_poisoned", 5);
}

// /train/cuda_graph "step": the optimizer's part of the step replayed as a graph too, its
// learning rate (cosine warm-up: a new one every step), step, gradient scale and clipping
// read on the device. Clipping is on and active (a small grad_clip); f16's dynamic loss
// scale starts far too high and doubles after every finite step, so steps overflow and are
// skipped on the device, graphed steps among them; SGD with momentum reads its step (its
// first starts the buffer); AdamW with bf16 moments replays its bf16 kernels. Every step's
// loss and gradient norm, the validation losses and the skipped steps must be the direct
// run's, to the bit.
TEST_F(CudaGraphTest, GraphedUpdateGivesTheDirectSteps) {
  struct Run {
    const char* name;
    const char* params;
    bool sgd;
    bool bf16_moments = false;  // AdamW's moments in bf16 (precision-aware optimizer)
  };
  for (const Run& run :
       {Run{"step_f32", "f32", false}, Run{"step_f16", "f16", false}, Run{"step_sgd", "f32", true},
        Run{"step_bf16_moments", "bf16", false, true}}) {
    SCOPED_TRACE(run.name);
    nlohmann::json body = tiny_spec(8);
    body["precision"] = {{"params", run.params}};
    body["train"]["grad_clip"] = 0.05;
    if (std::string(run.params) == "f16") {
      body["precision"]["initial_loss_scale"] = 1 << 20;
      body["precision"]["loss_scale_window"] = 1;
    }
    if (run.sgd) body["optimizer"] = {{"impl", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}};
    if (run.bf16_moments) {
      body["optimizer"]["exp_avg_dtype"] = "bf16";
      body["optimizer"]["exp_avg_sq_dtype"] = "bf16";
    }
    const std::string name = run.name;
    auto direct = train(name + "_direct", body);
    ASSERT_EQ(direct.exit_code, 0) << direct.out << direct.err;
    body["train"]["cuda_graph"] = "step";
    auto graphed = train(name + "_graphed", body);
    ASSERT_EQ(graphed.exit_code, 0) << graphed.out << graphed.err;
    EXPECT_THAT(graphed.out + graphed.err,
                HasSubstr("step 3: capturing the forward and backward, and the optimizer's "
                          "step, after 2 direct steps"));
    expect_same(name + "_direct", name + "_graphed", 8);
    Curve c = curve(name + "_direct");
    for (const auto& [step, lg] : c.steps) {
      if (std::find(c.skipped.begin(), c.skipped.end(), step) == c.skipped.end()) {
        EXPECT_GT(lg.second, 0.05) << "step " << step << ": the clipping should be active";
      } else {
        EXPECT_TRUE(std::isnan(lg.second)) << "step " << step << " was skipped";
      }
    }
    if (std::string(run.params) == "f16") {
      std::printf("%s: skipped steps", run.name);
      for (int64_t s : c.skipped) std::printf(" %lld", static_cast<long long>(s));
      std::printf("\n");
      EXPECT_TRUE(std::any_of(c.skipped.begin(), c.skipped.end(), [](int64_t s) { return s >= 3; }))
          << "no graphed step overflowed: the skip on the device went untested";
    }
  }
}

// What the device cannot decide alone is refused with the reason: result validation (it
// reads the norm before the update).
TEST_F(CudaGraphTest, GraphedUpdateRefusesResultValidation) {
  nlohmann::json body = tiny_spec(3);
  body["train"]["cuda_graph"] = "step";
  body["train"]["rerun_mode"] = "validate_results";
  auto r = train("step_validate", body);
  std::printf("%s", r.err.c_str());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("/train/cuda_graph 'step' decides on the device whether to "
                               "update, where result validation"));
  EXPECT_THAT(r.err, HasSubstr("set /train/rerun_mode to \"disabled\""));
}

// The shipped dense families, shrunk to a few tokens: LLaMA (RMSNorm, SwiGLU, rotary, GQA),
// Qwen3 (QK norm), a Mamba-2 hybrid (convolution, SSD scan, gated norm), and GPT under full
// recomputation (the forward run again inside the backward, inside the graph).
class CudaGraphFamilyTest : public CudaGraphTest,
                            public ::testing::WithParamInterface<const char*> {};

TEST_P(CudaGraphFamilyTest, GraphedStepsGiveTheDirectLosses) {
  const std::string family = GetParam();
  const bool recompute = family == "gpt_tiny_recompute";
  nlohmann::json body = nlohmann::json::parse(
      read_file("configs/" + (recompute ? std::string("gpt_tiny") : family) + ".json"));
  nlohmann::json small = tiny_spec(5);
  body["data"] = small["data"];
  body["train"] = small["train"];
  body["lr_schedule"] = small["lr_schedule"];
  body["kernels"] = small["kernels"];
  body.erase("log");
  body.erase("checkpoint");
  body["model"]["max_position_embeddings"] = 32;
  if (recompute) body["train"]["recompute"] = "full";
  auto direct = train(family + "_direct", body);
  ASSERT_EQ(direct.exit_code, 0) << direct.out << direct.err;
  body["train"]["cuda_graph"] = "forward_backward";
  auto graphed = train(family + "_graphed", body);
  ASSERT_EQ(graphed.exit_code, 0) << graphed.out << graphed.err;
  EXPECT_THAT(graphed.out + graphed.err, HasSubstr("capturing the forward and backward"));
  expect_same(family + "_direct", family + "_graphed", 5);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaGraphFamilyTest,
                         ::testing::Values("llama_tiny", "qwen3_tiny", "hybrid_tiny",
                                           "gpt_tiny_recompute"));

// FP8 delayed scaling: the recipe keeps its amax history, its position in it and the scales
// in device memory, which the step's end updates outside the graph; the replays quantise
// with each step's scales.
TEST_F(CudaGraphTest, Fp8GraphedStepsGiveTheDirectLosses) {
  for (const char* recipe : {"delayed", "tensorwise"}) {
    SCOPED_TRACE(recipe);
    nlohmann::json body = tiny_spec(6);
    body["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", recipe}}}};
    if (std::string(recipe) == "delayed") body["precision"]["fp8"]["amax_history_len"] = 2;
    const std::string name = std::string("fp8_") + recipe;
    auto direct = train(name + "_direct", body);
    ASSERT_EQ(direct.exit_code, 0) << direct.out << direct.err;
    body["train"]["cuda_graph"] = "forward_backward";
    auto graphed = train(name + "_graphed", body);
    ASSERT_EQ(graphed.exit_code, 0) << graphed.out << graphed.err;
    expect_same(name + "_direct", name + "_graphed", 6);
  }
}

// Dropout draws new masks each step, which a replay cannot: refused, naming the request.
TEST_F(CudaGraphTest, DropoutIsRefusedWithTheReason) {
  nlohmann::json body = tiny_spec(3);
  body["model"]["hidden_dropout"] = 0.1;
  body["train"]["cuda_graph"] = "forward_backward";
  auto r = train("dropout", body);
  std::printf("%s", r.err.c_str());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("/train/cuda_graph: the forward and backward cannot be replayed "
                               "as a graph: a module asked for a random stream"));
  EXPECT_THAT(r.err, HasSubstr("set the model's dropout probabilities to 0"));
}

// A mixture of experts reads its token counts on the host in the middle of the forward:
// the capture fails there, and says so.
TEST_F(CudaGraphTest, AHostReadInsideThePassIsRefusedWithTheReason) {
  nlohmann::json body = tiny_spec(3);
  body["model"]["add_bias_linear"] = false;
  body["model"]["layer"]["mlp"] = nlohmann::json::parse(R"({
      "impl": "moe", "num_experts": 4, "moe_ffn_hidden_size": 16,
      "router": {"impl": "topk", "topk": 2}})");
  body["train"]["cuda_graph"] = "forward_backward";
  auto r = train("moe", body);
  std::printf("%s", r.err.c_str());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("/train/cuda_graph: capturing the forward and backward failed"));
  EXPECT_THAT(r.err, HasSubstr("copy while a graph is being captured"));
}

TEST_F(CudaGraphTest, TheCpuCannotCaptureGraphs) {
  nlohmann::json body = tiny_spec(3);
  body["train"]["device"] = "cpu";
  body.erase("kernels");
  body["train"]["cuda_graph"] = "forward_backward";
  auto r = train("cpu", body);
  std::printf("%s", r.err.c_str());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("/train/cuda_graph 'forward_backward' needs a device whose "
                               "runtime captures graphs, not the CPU"));
}

}  // namespace
}  // namespace loom
