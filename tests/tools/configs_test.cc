// Every spec in configs/ is valid as shipped: `loom spec validate --load` resolves it against
// the shipped plugins and builds its components, so each plugin's own option checks run (a
// model's whole configuration, an MoE layer's router and dispatcher). The specs of
// configs/gpu need a CUDA device to build; without one they are checked against the schemas
// only, and the test says so.
//
// And every spec runs (README: "configs/ holds specs that run as shipped"): `loom train`
// takes one step of each, exit 0, with a finite loss in metrics.jsonl. Only the length
// changes: train.steps 1, one validation batch, no checkpoint at the end, and the LR
// schedule's decay_steps pinned to the shipped train.steps (its default), so that the
// warmup still fits and step 1 gets the shipped LR. The model, data, tokenizer, optimizer,
// precision and the end-of-run sample stay as shipped. Specs that read data.corpus (the
// Python docs) prepare it once into one cache shared by the whole test. The specs of
// configs/gpu run only where there is a CUDA device; elsewhere each is a skipped case that
// says why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/util/test_plugins.h"

namespace fs = std::filesystem;
using loom::testing::read_file;
using loom::testing::run_loom;
using ::testing::HasSubstr;

namespace {

TEST(Configs, EveryShippedSpecValidatesWithItsComponentsBuilt) {
  int checked = 0;
  for (const auto& entry : fs::recursive_directory_iterator("configs")) {
    if (entry.path().extension() != ".json") continue;
    const bool gpu = entry.path().parent_path().filename() == "gpu";
    if (gpu) std::printf("%s: schema only (building needs a CUDA device)\n", entry.path().c_str());
    auto r = run_loom("spec validate " + entry.path().string() + (gpu ? "" : " --load"));
    EXPECT_EQ(r.exit_code, 0) << entry.path() << "\n" << r.out << r.err;
    ++checked;
  }
  EXPECT_GE(checked, 6);
}

// The specs directly in `dir`, by name.
std::vector<std::string> specs_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".json")
      out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string case_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = fs::path(info.param).stem().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

// The data.corpus cache of every spec in this test: prepared by the first that needs it.
const fs::path& corpus_cache() {
  static const fs::path dir = loom::testing::fresh_dir("configs_test_corpora");
  return dir;
}

// Smaller steps where the shipped one is slow on CI (2 cores, and the ASan build). GPT-2 124M:
// the shipped micro-batch of 8 x 128 tokens takes 21 s and 3.1 GB in the default build; one
// sequence of the shipped length, 5 s and 2.1 GB, most of it building and initialising the
// 124M parameters and the AdamW state. The model, sequence length and all else stay.
const std::vector<std::pair<std::string, std::string>> kSmaller = {
    {"gpt2_124m", "train.micro_batch_size=1"}};

struct Step {
  loom::testing::RunResult run;
  std::vector<nlohmann::json> losses;  // metrics.jsonl lines with a training loss
  std::vector<nlohmann::json> valid;   // and with a validation loss
  double seconds = 0;
};

// One step of the spec at `path` as shipped, but for the length (see the top).
Step one_step(const std::string& path) {
  const nlohmann::json spec = nlohmann::json::parse(read_file(path));
  const std::string name = fs::path(path).stem().string();
  std::vector<std::string> settings = {"train.steps=1", "train.eval_steps=1",
                                       "checkpoint.save_at_end=false"};
  const int64_t steps = spec.contains("train") ? spec["train"].value("steps", int64_t{1000}) : 1000;
  if (spec.contains("lr_schedule") && !spec["lr_schedule"].contains("decay_steps"))
    settings.push_back("lr_schedule.decay_steps=" + std::to_string(steps));
  if (spec.contains("data") && spec["data"].contains("corpus"))
    settings.push_back("data.corpus.cache_dir=" + nlohmann::json(corpus_cache().string()).dump());
  for (const auto& [config, setting] : kSmaller)
    if (config == name) settings.push_back(setting);
  std::string args = "train '" + path + "'";
  for (const std::string& s : settings) args += " --set '" + s + "'";
  const fs::path run_dir = loom::testing::fresh_dir("configs_test_" + name) / "run";
  args += " --run-dir '" + run_dir.string() + "'";

  Step step;
  const auto t0 = std::chrono::steady_clock::now();
  step.run = run_loom(args);
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: exit %d in %.1f s (loom %s)\n", name.c_str(), step.run.exit_code, step.seconds,
              args.c_str());
  if (fs::exists(run_dir / "metrics.jsonl")) {
    std::stringstream lines(read_file(run_dir / "metrics.jsonl"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      nlohmann::json m = nlohmann::json::parse(line);
      if (m.contains("loss")) step.losses.push_back(m);
      if (m.contains("valid_loss")) step.valid.push_back(m);
    }
  }
  return step;
}

// The step ran, was not skipped, and its loss is finite and near ln(vocab_size), where an
// untrained model's next-token loss starts (the shipped specs start from random weights).
void expect_a_good_first_step(const std::string& path, const Step& step) {
  ASSERT_EQ(step.run.exit_code, 0) << step.run.out << step.run.err;
  ASSERT_EQ(step.losses.size(), 1u) << step.run.out;
  const nlohmann::json& m = step.losses[0];
  EXPECT_EQ(m["step"], 1) << m;
  EXPECT_EQ(m["skipped"], 0) << m;
  ASSERT_TRUE(m["loss"].is_number()) << "loss not finite: " << m;
  ASSERT_TRUE(m["grad_norm"].is_number()) << "gradient norm not finite: " << m;
  const double loss = m["loss"].get<double>();
  const nlohmann::json spec = nlohmann::json::parse(read_file(path));
  ASSERT_TRUE(spec["model"].contains("vocab_size")) << path;
  const double uniform = std::log(spec["model"]["vocab_size"].get<double>());
  std::printf("  loss %.6f (ln vocab %.6f), grad norm %.6g\n", loss, uniform,
              m["grad_norm"].get<double>());
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, uniform, 1.0);
  ASSERT_EQ(step.valid.size(), 1u) << step.run.out;
  ASSERT_TRUE(step.valid[0]["valid_loss"].is_number()) << step.valid[0];
  EXPECT_TRUE(std::isfinite(step.valid[0]["valid_loss"].get<double>()));
}

class CpuConfig : public ::testing::TestWithParam<std::string> {};
class GpuConfig : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuConfig, TrainsAStepAsShipped) {
  const std::string& path = GetParam();
  const nlohmann::json spec = nlohmann::json::parse(read_file(path));
  if (spec.contains("data") && spec["data"].contains("corpus"))
    for (const auto& input : spec["data"]["corpus"]["inputs"])
      if (!fs::exists(input.get<std::string>()))
        GTEST_SKIP() << path << " reads " << input << ", not installed here (Debian python3-doc "
                     << "for the Python docs; tools/setup installs it)";
  expect_a_good_first_step(path, one_step(path));
}

TEST_P(GpuConfig, TrainsAStepOnACudaDevice) {
  const std::string& path = GetParam();
  Step step = one_step(path);
  if (step.run.exit_code == 7 && step.run.err.find("no cuda device") != std::string::npos) {
    EXPECT_THAT(step.run.err, HasSubstr("spec /train/device 'cuda': no cuda device: "));
    GTEST_SKIP() << path << " needs a CUDA device: " << step.run.err;
  }
  expect_a_good_first_step(path, step);
}

INSTANTIATE_TEST_SUITE_P(Configs, CpuConfig, ::testing::ValuesIn(specs_in("configs")), case_name);
INSTANTIATE_TEST_SUITE_P(Configs, GpuConfig, ::testing::ValuesIn(specs_in("configs/gpu")),
                         case_name);

}  // namespace
