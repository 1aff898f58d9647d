// `loom generate` end to end: a tiny model trained on a small corpus by `loom train` (which
// saves checkpoints with its tokenizer), then text from the checkpoint: streamed output
// equals the JSON completion, greedy decoding and seeded sampling repeat, batch mode writes
// one JSON line per prompt (plain and JSONL lines), the model's maximum length stops
// generation with a note, and every bad argument is one line naming the option (exit 2).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using ::testing::HasSubstr;
using testing::run_loom;
using ::testing::StartsWith;
using testing::write_file;

constexpr int kOk = 0, kUsage = 2;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The run is trained once for the whole suite (a few seconds).
class GenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fresh_dir("generate_test"));
    fs::path text = *dir_ / "text";
    fs::create_directories(text);
    std::vector<std::string> words = {"the",  "quick", "brown", "fox",   "jumps", "over",
                                      "lazy", "dog",   "and",   "cat",   "runs",  "fast",
                                      "in",   "green", "field", "while", "birds", "sing"};
    std::mt19937 rng(7);
    for (int d = 0; d < 30; ++d) {
      std::string doc;
      for (int w = 0; w < 200; ++w) doc += (w ? " " : "") + words[rng() % words.size()];
      write_file(text / ("doc" + std::to_string(100 + d) + ".txt"), doc + "\n");
    }
    nlohmann::json spec = nlohmann::json::parse(R"({
      "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                "vocab_size": 320, "max_position_embeddings": 32,
                "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                          "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
                "final_norm": {"impl": "layernorm"}},
      "optimizer": {"impl": "adamw", "lr": 0.01},
      "train": {"steps": 200, "micro_batch_size": 4, "seq_length": 16, "log_interval": 50}
    })");
    spec["data"] = {{"corpus",
                     {{"inputs", {text.string()}},
                      {"vocab_size", 300},
                      {"cache_dir", (*dir_ / "corpora").string()}}}};
    write_file(*dir_ / "spec.json", spec.dump(2));
    auto r =
        run_loom("train " + q(*dir_ / "spec.json") + " --run-dir " + q(*dir_ / "run") +
                 " --set checkpoint.dir=" + q(*dir_ / "ckpt") + " --set checkpoint.interval=100");
    train_ok_ = r.exit_code == kOk;
    train_log_ = r.out + r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override { ASSERT_TRUE(train_ok_) << train_log_; }

  static std::string checkpoint() { return " --checkpoint " + q(*dir_ / "ckpt"); }

  static fs::path* dir_;
  static bool train_ok_;
  static std::string train_log_;
};

fs::path* GenerateTest::dir_ = nullptr;
bool GenerateTest::train_ok_ = false;
std::string GenerateTest::train_log_;

TEST_F(GenerateTest, StreamsTheCompletionAndJsonAgrees) {
  std::string args = checkpoint() + " --prompt 'the quick brown' --max-new-tokens 12";
  auto streamed = run_loom("generate" + args + " --temperature 0");
  ASSERT_EQ(streamed.exit_code, kOk) << streamed.err;
  auto json = run_loom("generate" + args + " --temperature 0 --json");
  ASSERT_EQ(json.exit_code, kOk) << json.err;
  auto lines = json_lines(json.out);
  ASSERT_EQ(lines.size(), 1u) << json.out;
  const nlohmann::json& j = lines[0];
  EXPECT_EQ(j["prompt"], "the quick brown");
  EXPECT_EQ(j["new_tokens"].get<size_t>(), j["tokens"].size());
  EXPECT_GE(j["new_tokens"].get<int>(), 1);
  EXPECT_LE(j["new_tokens"].get<int>(), 12);
  EXPECT_FALSE(j["completion"].get<std::string>().empty());
  // Streamed: the prompt, then the completion as it was decoded, then a newline.
  EXPECT_EQ(streamed.out, "the quick brown" + j["completion"].get<std::string>() + "\n");
  // Greedy decoding repeats exactly.
  auto again = run_loom("generate" + args + " --temperature 0 --json");
  EXPECT_EQ(again.out, json.out);
  // The trained model writes letters and spaces, the alphabet of its corpus.
  EXPECT_THAT(j["completion"].get<std::string>(),
              ::testing::MatchesRegex("[a-z \n]*[a-z][a-z \n]*"));
}

TEST_F(GenerateTest, SeededSamplingRepeatsAndSeedsDiffer) {
  std::string args = checkpoint() +
                     " --prompt 'the' --max-new-tokens 16 --temperature 1.2 --top-k 50 "
                     "--top-p 0.95 --json";
  auto a = run_loom("generate" + args + " --seed 3");
  auto b = run_loom("generate" + args + " --seed 3");
  ASSERT_EQ(a.exit_code, kOk) << a.err;
  EXPECT_EQ(a.out, b.out);
  bool differs = false;
  for (int seed = 4; seed < 8 && !differs; ++seed)
    differs = run_loom("generate" + args + " --seed " + std::to_string(seed)).out != a.out;
  EXPECT_TRUE(differs) << "four other seeds all gave " << a.out;
}

TEST_F(GenerateTest, BatchWritesOneJsonLinePerPrompt) {
  fs::path prompts = *dir_ / "prompts.txt";
  write_file(prompts, "the quick brown\n\n{\"prompt\": \"a cat\\nruns\", \"id\": 7}\nbirds\r\n");
  auto r = run_loom("generate" + checkpoint() + " --prompts " + q(prompts) +
                    " --max-new-tokens 5 --temperature 0.8 --seed 1");
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0]["prompt"], "the quick brown");
  EXPECT_EQ(lines[1]["prompt"], "a cat\nruns");
  EXPECT_EQ(lines[2]["prompt"], "birds");
  for (const auto& j : lines) {
    for (const char* key : {"prompt", "completion", "tokens", "new_tokens", "stop"})
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
    EXPECT_EQ(j["new_tokens"].get<size_t>(), j["tokens"].size());
    EXPECT_LE(j["new_tokens"].get<int>(), 5);
  }
  // A prompt's completion does not depend on the prompts before it.
  auto single = run_loom("generate" + checkpoint() +
                         " --prompt birds --max-new-tokens 5 --temperature 0.8 --seed 1 --json");
  ASSERT_EQ(single.exit_code, kOk) << single.err;
  EXPECT_EQ(json_lines(single.out).at(0), lines[2]);
}

TEST_F(GenerateTest, StopsAtTheModelsMaximumLengthAndSaysSo) {
  // 32 positions: a prompt of a few tokens and 100 new ones stops at 32 in all.
  auto r = run_loom("generate" + checkpoint() +
                    " --prompt 'the dog' --max-new-tokens 100 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  nlohmann::json j = json_lines(r.out).at(0);
  EXPECT_EQ(j["stop"], "max_sequence") << j.dump();
  EXPECT_LT(j["new_tokens"].get<int>(), 32);
  EXPECT_GT(j["new_tokens"].get<int>(), 20);
  EXPECT_THAT(r.err, HasSubstr("maximum sequence of 32 tokens"));
  // A prompt longer than the model is refused.
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "field birds ";
  r = run_loom("generate" + checkpoint() + " --prompt '" + long_prompt + "'");
  EXPECT_EQ(r.exit_code, kUsage) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--prompt"));
  EXPECT_THAT(r.err, HasSubstr("maximum sequence of 32"));
}

TEST_F(GenerateTest, EveryBadArgumentIsOneLineNamingTheOption) {
  fs::path prompts = *dir_ / "bad_prompts.txt";
  write_file(prompts, "{\"text\": \"no prompt key\"}\n");
  std::string ck = checkpoint();
  struct Bad {
    std::string args, expect;
  };
  for (const Bad& b : std::vector<Bad>{
           {"--prompt x", "--checkpoint DIR is required"},
           {"--checkpoint /no/such/dir --prompt x", "--checkpoint '/no/such/dir'"},
           {ck, "exactly one of --prompt TEXT or --prompts FILE"},
           {ck + " --prompt x --prompts " + q(prompts), "exactly one of"},
           {ck + " --prompt x --temperature -1", "--temperature expects a number >= 0"},
           {ck + " --prompt x --temperature hot", "--temperature"},
           {ck + " --prompt x --top-p 0", "--top-p expects a number in (0, 1]"},
           {ck + " --prompt x --top-p 1.5", "--top-p"},
           {ck + " --prompt x --top-k -3", "--top-k"},
           {ck + " --prompt x --max-new-tokens 0", "--max-new-tokens"},
           {ck + " --prompt x --seed abc", "--seed"},
           {ck + " --prompt x --tokenizer /no/such/tok", "--tokenizer '/no/such/tok'"},
           {ck + " --prompts /no/such/file", "--prompts '/no/such/file'"},
           {ck + " --prompts " + q(prompts), "needs a \"prompt\" string"},
       }) {
    SCOPED_TRACE(b.args);
    auto r = run_loom("generate " + b.args);
    EXPECT_EQ(r.exit_code, kUsage) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(b.expect));
    EXPECT_THAT(r.err, StartsWith("loom generate: error: "));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // A misspelt option gets the parser's did-you-mean and the usage line.
  auto r = run_loom("generate " + ck + " --prompt x --topk 3");
  EXPECT_EQ(r.exit_code, kUsage) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("did you mean '--top-k'?"));
}

TEST_F(GenerateTest, ACheckpointWithoutTokenizerNeedsTokenizer) {
  // Mock data has no tokenizer: the checkpoint holds none.
  fs::path mock = *dir_ / "mock";
  nlohmann::json spec = nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 1, "hidden_size": 32, "num_attention_heads": 4,
              "vocab_size": 320, "max_position_embeddings": 32,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "dot_product"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "data": {"mock": true},
    "train": {"steps": 2, "micro_batch_size": 2, "seq_length": 16}
  })");
  write_file(mock / "spec.json", spec.dump());
  auto r = run_loom("train " + q(mock / "spec.json") + " --run-dir " + q(mock / "run") +
                    " --set checkpoint.dir=" + q(mock / "ckpt") + " --set checkpoint.interval=1");
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  r = run_loom("generate --checkpoint " + q(mock / "ckpt") + " --prompt the");
  EXPECT_EQ(r.exit_code, kUsage) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("pass --tokenizer"));
  // The tokenizer of the other run fits this model (300 ids <= 320).
  fs::path tokenizer;
  for (const auto& e : fs::recursive_directory_iterator(*dir_ / "ckpt"))
    if (e.path().filename() == "merges.txt") tokenizer = e.path().parent_path();
  ASSERT_FALSE(tokenizer.empty()) << "the trained checkpoint saved no tokenizer";
  r = run_loom("generate --checkpoint " + q(mock / "ckpt") + " --prompt the --tokenizer " +
               q(tokenizer) + " --max-new-tokens 3 --json");
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  EXPECT_LE(json_lines(r.out).at(0)["new_tokens"].get<int>(), 3);
}

}  // namespace
}  // namespace loom
