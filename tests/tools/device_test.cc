// `loom train` on a device other than the CPU, end to end, without a GPU: the fake CUDA
// device (tests/plugins/fake_cuda) holds every tensor in memory that the host cannot touch
// (tagged pointers fault) and runs the CPU kernels. The same spec must give the same losses
// on "cpu" and "cuda", which proves that nothing above the kernels reads or writes device
// memory except through IHost (batches, loss, gradient norm, master weights, checkpoints).
// And without a device runtime, or with one that finds no device, the run stops before
// start with one message that names the fix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

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
              "vocab_size": 64, "max_position_embeddings": 32, "hidden_dropout": 0.1,
              "attention_dropout": 0.1,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "lr_schedule": {"impl": "cosine", "warmup_steps": 2},
    "data": {"mock": true},
    "train": {"micro_batch_size": 2, "seq_length": 16, "log_interval": 1,
              "eval_interval": 3, "eval_steps": 1, "global_batch_size": 4}
  })");
  s["train"]["steps"] = steps;
  return s;
}

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("device_test");
    testing::install_test_plugin(dir_ / "plugins", "fake_cuda", "testfakecuda");
  }
  // Its bf16 runs crash LeakSanitizer's tracer at exit (testing::WithoutLeakCheck).
  testing::WithoutLeakCheck no_leak_scan_;
  std::string env() const { return "LOOM_PLUGIN_PATH='" + (dir_ / "plugins").string() + "'"; }
  // Runs `body` on `device` ("cpu", or "cuda" on the fake device) in run dir `name`.
  testing::RunResult train(const std::string& name, nlohmann::json body, const std::string& device,
                           const std::string& extra = "") {
    body["train"]["device"] = device;
    if (device == "cuda") body["kernels"] = {{"libraries", {"testfakecuda"}}};
    fs::path spec = dir_ / (name + ".json");
    write_file(spec, body.dump(2));
    return run_loom(
        "train '" + spec.string() + "' --run-dir '" + (dir_ / name).string() + "' " + extra, env());
  }
  // step -> (loss, grad norm), and the validation losses, of a run's metrics.
  struct Curve {
    std::map<int64_t, std::pair<double, double>> steps;
    std::vector<double> valid;
    double peak_mem = 0;
  };
  Curve curve(const std::string& name) {
    Curve c;
    std::stringstream lines(read_file(dir_ / name / "metrics.jsonl"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      nlohmann::json m = nlohmann::json::parse(line);
      if (m.contains("loss"))
        c.steps[m["step"].get<int64_t>()] = {m["loss"].get<double>(), m["grad_norm"].get<double>()};
      if (m.contains("valid_loss")) c.valid.push_back(m["valid_loss"].get<double>());
      if (m.contains("peak_mem_bytes")) c.peak_mem = m["peak_mem_bytes"].get<double>();
    }
    return c;
  }
  static void expect_same(const Curve& a, const Curve& b, const std::string& what) {
    ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
    for (const auto& [step, lg] : a.steps) {
      ASSERT_TRUE(b.steps.count(step)) << what << " step " << step;
      // The same kernels on the same inputs: bit-identical.
      EXPECT_EQ(b.steps.at(step).first, lg.first) << what << " loss at step " << step;
      EXPECT_EQ(b.steps.at(step).second, lg.second) << what << " grad norm at step " << step;
    }
    EXPECT_EQ(a.valid, b.valid) << what;
  }
  fs::path dir_;
};

TEST_F(DeviceTest, SameLossesOnTheFakeDeviceAsOnTheCpu) {
  for (const char* params : {"f32", "bf16"}) {
    SCOPED_TRACE(params);
    nlohmann::json body = tiny_spec(6);
    body["precision"] = {{"params", params}};
    auto cpu = train(std::string("cpu_") + params, body, "cpu");
    ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
    auto dev = train(std::string("dev_") + params, body, "cuda");
    ASSERT_EQ(dev.exit_code, 0) << dev.out << dev.err;
    EXPECT_THAT(dev.out, HasSubstr("device fake CUDA device (host memory)"));
    EXPECT_THAT(dev.out, HasSubstr(std::string("gemm:") + params + "=cpu."))
        << "the fake device runs the CPU kernels";
    Curve a = curve(std::string("cpu_") + params), b = curve(std::string("dev_") + params);
    ASSERT_EQ(a.steps.size(), 6u);
    expect_same(a, b, params);
    // Peak memory comes from the device runtime's figures.
    EXPECT_GT(b.peak_mem, 0);
  }
}

// A mixture of experts on a device: the routing goes to the host and back, the grouped GEMM
// gets its weights as an array of device pointers, and under full recomputation the
// dispatcher carries its indices from dispatch to combine through a forward-only context.
// The CPU's losses to the bit, with either dispatcher.
TEST_F(DeviceTest, MixtureOfExpertsGivesTheCpuLossesOnTheDevice) {
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    nlohmann::json body = tiny_spec(4);
    body["model"]["add_bias_linear"] = false;
    body["model"]["layer"]["mlp"] = nlohmann::json::parse(R"({
      "impl": "moe", "num_experts": 4, "moe_ffn_hidden_size": 16, "activation": "swiglu",
      "router": {"impl": "topk", "topk": 2, "aux_loss_coeff": 0.01, "z_loss_coeff": 0.001}})");
    body["model"]["layer"]["mlp"]["dispatcher"] = {{"impl", dispatcher}};
    body["train"]["recompute"] = "full";
    const std::string name = std::string("moe_") + dispatcher;
    auto cpu = train(name + "_cpu", body, "cpu");
    ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
    auto dev = train(name + "_dev", body, "cuda");
    ASSERT_EQ(dev.exit_code, 0) << dev.out << dev.err;
    EXPECT_THAT(dev.out, HasSubstr("grouped_gemm:f32=cpu."));
    Curve a = curve(name + "_cpu"), b = curve(name + "_dev");
    ASSERT_EQ(a.steps.size(), 4u);
    expect_same(a, b, dispatcher);
  }
}

// FP8 on a device: the recipe keeps its amax history and scales in device memory and
// touches them only through kernels and IHost; the same losses as on the CPU, to the bit.
TEST_F(DeviceTest, Fp8RecipesGiveTheCpuLossesOnTheDevice) {
  for (const char* recipe : {"delayed", "tensorwise"}) {
    SCOPED_TRACE(recipe);
    nlohmann::json body = tiny_spec(6);
    body["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", recipe}, {"amax_history_len", 2}}}};
    if (std::string(recipe) == "tensorwise") body["precision"]["fp8"].erase("amax_history_len");
    auto cpu = train(std::string("fp8_cpu_") + recipe, body, "cpu");
    ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
    auto dev = train(std::string("fp8_dev_") + recipe, body, "cuda");
    ASSERT_EQ(dev.exit_code, 0) << dev.out << dev.err;
    EXPECT_THAT(dev.out, HasSubstr("fp8_gemm:fp8_e4m3=cpu."));
    Curve a = curve(std::string("fp8_cpu_") + recipe), b = curve(std::string("fp8_dev_") + recipe);
    ASSERT_EQ(a.steps.size(), 6u);
    expect_same(a, b, recipe);
  }
}

TEST_F(DeviceTest, CheckpointOnTheDeviceResumesExactly) {
  nlohmann::json body = tiny_spec(6);
  body["precision"] = {{"params", "bf16"}};
  auto whole = train("whole", body, "cuda");
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;

  // Saves at 3 and 6; the newest is removed, so the second run resumes at 3 and runs 4..6
  // again (its metrics lines for those steps come last and are the ones compared).
  body["checkpoint"] = {{"interval", 3}, {"resume", "auto"}};
  auto first = train("resumed", body, "cuda");
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  fs::remove_all(dir_ / "resumed" / "checkpoints" / "iter_0000006");
  auto second = train("resumed", body, "cuda");
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_THAT(second.out, HasSubstr("resume: iteration 3"));
  Curve a = curve("whole"), b = curve("resumed");
  ASSERT_EQ(b.steps.size(), 6u);
  expect_same(a, b, "resumed on the device");

  // A checkpoint written on the device resumes on the CPU, with the same losses.
  fs::remove_all(dir_ / "resumed" / "checkpoints" / "iter_0000006");
  fs::create_directories(dir_ / "on_cpu");
  fs::copy(dir_ / "resumed" / "checkpoints", dir_ / "on_cpu" / "checkpoints",
           fs::copy_options::recursive);
  auto on_cpu = train("on_cpu", body, "cpu");
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.out << on_cpu.err;
  EXPECT_THAT(on_cpu.out, HasSubstr("resume: iteration 3"));
  Curve c = curve("on_cpu");
  for (int64_t step = 4; step <= 6; ++step) {
    ASSERT_TRUE(c.steps.count(step)) << step;
    EXPECT_EQ(c.steps.at(step).first, a.steps.at(step).first) << "loss at step " << step;
  }
}

// Decoding on the device: the sample a run prints at its end (its trained weights, decoded
// with a KV cache on the device it trained on) and `loom generate --device cuda` give the
// CPU's text, token for token.
TEST_F(DeviceTest, GenerationOnTheDeviceGivesTheCpuText) {
  fs::path text = dir_ / "text";
  fs::create_directories(text);
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"};
  for (int d = 0; d < 8; ++d) {
    std::string doc;
    for (int w = 0; w < 120; ++w) doc += std::string(w ? " " : "") + words[(d * 7 + w * w) % 8];
    write_file(text / ("doc" + std::to_string(d) + ".txt"), doc + "\n");
  }
  nlohmann::json body = tiny_spec(20);
  body["model"]["vocab_size"] = 320;
  body["data"] = {{"corpus",
                   {{"inputs", {text.string()}},
                    {"vocab_size", 300},
                    {"cache_dir", (dir_ / "corpora").string()}}}};
  body["log"] = {{"sample", {{"prompt", "the quick"}, {"max_new_tokens", 8}, {"seed", 3}}}};
  body["checkpoint"] = {{"dir", (dir_ / "dev_ckpt").string()}};
  auto cpu = train("gen_cpu", body, "cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
  auto dev = train("gen_dev", body, "cuda");
  ASSERT_EQ(dev.exit_code, 0) << dev.out << dev.err;
  auto sample = [](const std::string& out) {
    size_t at = out.find("sample (");
    return at == std::string::npos ? std::string("none") : out.substr(at);
  };
  EXPECT_NE(sample(dev.out), "none") << dev.out;
  EXPECT_EQ(sample(dev.out), sample(cpu.out));
  // The device-trained checkpoint, decoded on the device and on the CPU.
  std::string args = "generate --checkpoint '" + (dir_ / "dev_ckpt").string() +
                     "' --prompt 'the lazy' --max-new-tokens 10 --temperature 0 --json";
  auto on_dev = run_loom(args + " --device cuda", env());
  ASSERT_EQ(on_dev.exit_code, 0) << on_dev.out << on_dev.err;
  auto on_cpu = run_loom(args + " --device cpu", env());
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.out << on_cpu.err;
  EXPECT_EQ(on_dev.out, on_cpu.out);
  EXPECT_THAT(on_dev.out, HasSubstr("\"new_tokens\":"));
  auto bad = run_loom(args + " --device tpu", env());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--device 'tpu': use cpu or cuda"));
}

TEST_F(DeviceTest, NoDeviceRuntimeIsOneClearError) {
  nlohmann::json body = tiny_spec(2);
  body["train"]["device"] = "cuda";
  body["kernels"] = {{"libraries", {"kernels_cpu"}}};
  fs::path spec = dir_ / "nort.json";
  write_file(spec, body.dump(2));
  auto r = run_loom("train '" + spec.string() + "' --run-dir '" + (dir_ / "nort").string() + "'");
  EXPECT_EQ(r.exit_code, 7) << "7: something the run needs is not available here";
  EXPECT_THAT(r.err, HasSubstr("spec /train/device 'cuda': no cuda runtime in this process"));
  EXPECT_THAT(r.err, HasSubstr("set the device to cpu"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("Segmentation")));
}

// The real CUDA library: with a GPU the tiny model trains on it with the CPU's losses (to
// the bf16 tolerance of a different summation order); without one, `kernels_cuda` loads and
// the run stops before start with the CUDA runtime's reason.
TEST_F(DeviceTest, RealCudaMatchesTheCpuOrSaysWhyNot) {
  nlohmann::json body = tiny_spec(6);
  body["precision"] = {{"params", "bf16"}};
  auto cpu = train("cpu_ref", body, "cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
  {
    Curve c = curve("cpu_ref");
    ASSERT_FALSE(c.steps.empty());
    EXPECT_LT(c.steps.rbegin()->second.first, c.steps.begin()->second.first) << "CPU: no learning";
  }
  body["train"]["device"] = "cuda";  // default kernel library: kernels_cuda
  fs::path spec = dir_ / "real.json";
  write_file(spec, body.dump(2));
  auto r = run_loom("train '" + spec.string() + "' --run-dir '" + (dir_ / "real").string() + "'");
  if (r.exit_code != 0 && r.err.find("no cuda device") != std::string::npos) {
    EXPECT_EQ(r.exit_code, 7) << "7: something the run needs is not available here";
    EXPECT_THAT(r.err, HasSubstr("spec /train/device 'cuda': no cuda device: "));
    EXPECT_THAT(r.err, HasSubstr("set the device to cpu"));
    std::printf("[cuda] skipped: %s", r.err.c_str());
    GTEST_SKIP() << "no CUDA device: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Curve a = curve("cpu_ref"), b = curve("real");
  ASSERT_EQ(b.steps.size(), a.steps.size());
  ASSERT_FALSE(a.steps.empty());
  // It learns on the GPU too: the last loss below the first.
  EXPECT_LT(b.steps.rbegin()->second.first, b.steps.begin()->second.first) << "GPU";
  double worst = 0;
  for (const auto& [step, lg] : a.steps) {
    worst = std::max(worst, std::abs(b.steps.at(step).first - lg.first) / std::abs(lg.first));
    // bf16 activations in another summation order: 2e-3 of the loss.
    EXPECT_NEAR(b.steps.at(step).first, lg.first, 2e-3 * std::abs(lg.first)) << "step " << step;
    EXPECT_NEAR(b.steps.at(step).second, lg.second, 5e-2 * std::abs(lg.second) + 1e-3)
        << "grad norm at step " << step;
  }
  std::printf("[error] device loss vs CPU: max rel %.3g over %zu steps\n", worst, a.steps.size());
}

}  // namespace
}  // namespace loom
