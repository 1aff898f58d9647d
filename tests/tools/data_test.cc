// The data path end to end through the `loom` command: a tokenizer trained with
// `loom tokenizer train`, a dataset written by `loom preprocess`, training on it with
// data.paths (blends, EOD masks, packed-document resets), and data.corpus preparing and
// caching everything on first use.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::run_loom;
using testing::write_file;

constexpr int kOk = 0, kSpec = 3, kIo = 5;

// A small English-like corpus with structure a model can learn.
std::string corpus_text(int doc) {
  static const char* kSubjects[] = {"The parser", "A function", "The module", "This class"};
  static const char* kVerbs[] = {"returns", "reads", "writes", "checks"};
  static const char* kObjects[] = {"a list of tokens.", "the next line.", "an integer value.",
                                   "the file header."};
  std::string s;
  for (int i = 0; i < 12; ++i)
    s += std::string(kSubjects[(doc + i) % 4]) + " " + kVerbs[(doc * 3 + i) % 4] + " " +
         kObjects[(doc + 2 * i) % 4] + " ";
  return s;
}

nlohmann::json model_spec() {
  return nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "vocab_size": 320, "max_position_embeddings": 32,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "lr_schedule": {"impl": "cosine", "warmup_steps": 3},
    "train": {"steps": 30, "micro_batch_size": 4, "seq_length": 32, "log_interval": 10,
              "eval_interval": 15, "eval_steps": 2}
  })");
}

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("data_test");
    fs::create_directories(dir_ / "text");
    for (int d = 0; d < 40; ++d)
      write_file(dir_ / "text" / ("doc" + std::to_string(100 + d) + ".txt"), corpus_text(d));
    // One JSONL file for the second blend member.
    std::string jsonl;
    for (int d = 0; d < 30; ++d)
      jsonl += nlohmann::json({{"text", corpus_text(d + 7)}}).dump() + "\n";
    write_file(dir_ / "more.jsonl", jsonl);
  }
  static std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
  fs::path spec(const std::string& name, const nlohmann::json& body) {
    fs::path p = dir_ / name;
    write_file(p, body.dump(2));
    return p;
  }
  fs::path dir_;
};

TEST_F(DataTest, TokenizerPreprocessAndTrainOnABlend) {
  auto r = run_loom("tokenizer train --vocab-size 300 --output " + q(dir_ / "tok") + " " +
                    q(dir_ / "text"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  ASSERT_TRUE(fs::exists(dir_ / "tok" / "vocab.json"));
  ASSERT_TRUE(fs::exists(dir_ / "tok" / "merges.txt"));
  for (auto [input, out] :
       {std::pair{dir_ / "text", dir_ / "a"}, {dir_ / "more.jsonl", dir_ / "b"}}) {
    r = run_loom("preprocess --input " + q(input) + " --tokenizer " + q(dir_ / "tok") +
                 " --output " + q(out) + " --append-eod --workers 2");
    ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
    ASSERT_TRUE(fs::exists(out.string() + ".idx"));
  }
  nlohmann::json s = model_spec();
  s["data"] = {{"paths", {0.7, (dir_ / "a").string(), 0.3, (dir_ / "b").string()}},
               {"split", "90,10"},
               {"tokenizer", {{"path", (dir_ / "tok").string()}}},
               {"eod_mask_loss", true},
               {"reset_position_ids", true},
               {"reset_attention_mask", true}};
  r = run_loom("train " + q(spec("blend.json", s)) + " --run-dir " + q(dir_ / "run"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("unigram entropy"));
  EXPECT_THAT(r.out, HasSubstr("valid"));
  // The indices were cached beside the first prefix; a second run reads them.
  EXPECT_FALSE(fs::is_empty(dir_ / "cache" / "GPTDataset_indices"));
  r = run_loom("train " + q(spec("blend.json", s)) + " --run-dir " + q(dir_ / "run2") +
               " --set train.steps=2 --set lr_schedule.warmup_steps=1");
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
}

TEST_F(DataTest, CorpusIsPreparedOnceAndCached) {
  nlohmann::json s = model_spec();
  s["train"]["steps"] = 3;
  s["lr_schedule"]["warmup_steps"] = 1;
  s["data"] = {{"corpus",
                {{"inputs", {(dir_ / "text").string()}},
                 {"exclude", {"doc13*"}},
                 {"vocab_size", 300},
                 {"cache_dir", (dir_ / "corpora").string()}}}};
  fs::path p = spec("corpus.json", s);
  auto r = run_loom("train " + q(p) + " --run-dir " + q(dir_ / "run"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("preparing the corpus"));
  r = run_loom("train " + q(p) + " --run-dir " + q(dir_ / "run2"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("preparing the corpus")));
  EXPECT_THAT(r.err + r.out, HasSubstr("cached"));
  auto prepared_corpora = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_ / "corpora")) n += e.is_directory();
    return n;
  };
  ASSERT_EQ(prepared_corpora(), 1);
  // A source file changed in place (the same size, a later modification time): prepared
  // again, into a new cache entry.
  fs::path doc = dir_ / "text" / "doc105.txt";
  std::string text = testing::read_file(doc);
  text[0] = text[0] == 'x' ? 'y' : 'x';
  write_file(doc, text);
  fs::last_write_time(doc, fs::last_write_time(doc) + std::chrono::seconds(10));
  r = run_loom("train " + q(p) + " --run-dir " + q(dir_ / "run_changed"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("preparing the corpus"));
  EXPECT_EQ(prepared_corpora(), 2);
  // A new file in an input directory, and a file removed: prepared again each time.
  write_file(dir_ / "text" / "doc200.txt", corpus_text(3));
  r = run_loom("train " + q(p) + " --run-dir " + q(dir_ / "run_added"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("preparing the corpus"));
  EXPECT_EQ(prepared_corpora(), 3);
  fs::remove(dir_ / "text" / "doc200.txt");
  fs::remove(dir_ / "text" / "doc106.txt");
  r = run_loom("train " + q(p) + " --run-dir " + q(dir_ / "run_removed"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("preparing the corpus"));
  EXPECT_EQ(prepared_corpora(), 4);
  // An excluded file changing does not matter: the cache is used.
  write_file(dir_ / "text" / "doc130.txt", corpus_text(9));
  r = run_loom("train " + q(p) + " --run-dir " + q(dir_ / "run_excluded"));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("preparing the corpus")));
  EXPECT_EQ(prepared_corpora(), 4);
  // A tokenizer larger than the model's vocabulary is refused at /model/vocab_size.
  s["model"]["vocab_size"] = 200;
  r = run_loom("train " + q(spec("small.json", s)) + " --run-dir " + q(dir_ / "run3"));
  EXPECT_EQ(r.exit_code, kSpec) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/model/vocab_size"));
}

TEST_F(DataTest, BadDataSpecsNameTheProblem) {
  nlohmann::json s = model_spec();
  s["data"] = {{"paths", {(dir_ / "missing").string()}}};
  auto r = run_loom("train " + q(spec("missing.json", s)) + " --run-dir " + q(dir_ / "r1"));
  EXPECT_EQ(r.exit_code, kIo) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("loom preprocess"));
  s["data"] = {{"paths", {0.5, "a", 0.5}}};
  r = run_loom("train " + q(spec("odd.json", s)) + " --run-dir " + q(dir_ / "r2"));
  EXPECT_EQ(r.exit_code, kSpec) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/data/paths"));
  s["data"] = {{"corpus", {{"inputs", {(dir_ / "nowhere").string()}}}}};
  r = run_loom("train " + q(spec("nowhere.json", s)) + " --run-dir " + q(dir_ / "r3"));
  EXPECT_EQ(r.exit_code, kIo) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/data/corpus/inputs/0"));
  s["data"] = {{"paths", {(dir_ / "a").string()}}, {"eod_mask_loss", true}};
  r = run_loom("train " + q(spec("noeod.json", s)) + " --run-dir " + q(dir_ / "r4"));
  EXPECT_EQ(r.exit_code, kSpec) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/data/tokenizer"));
}

}  // namespace
}  // namespace loom
