// preprocess end to end with a fake tokenizer (bytes as ids): the dataset holds every
// document's ids (+ EOD) in input order, any number of workers writes the same bytes, and
// every failure is clean and leaves nothing at the output prefix.
#include "core/data/preprocess.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/util/errors.h"

namespace loom::core {
namespace {

namespace fs = std::filesystem;

// Ids are the text's bytes; EOD is 256 when present. A small delay that depends on the text
// makes workers finish batches out of order.
class ByteTokenizer : public Tokenizer {
 public:
  explicit ByteTokenizer(bool has_eod = true, int64_t vocab = 257)
      : has_eod_(has_eod), vocab_(vocab) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    encode_into(text, out);
    return out;
  }
  void encode_into(std::string_view text, std::vector<int32_t>& out) const override {
    if (text.find("BOOM") != std::string_view::npos) throw std::runtime_error("tokenizer boom");
    if (text.size() % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) out += static_cast<char>(id);
    return out;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> eod() const override {
    return has_eod_ ? std::optional<int32_t>(256) : std::nullopt;
  }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string id_to_token(int32_t) const override { return ""; }
  std::string describe() const override { return "bytes (test)"; }

 private:
  bool has_eod_;
  int64_t vocab_;
};

fs::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / "preprocess" / info->name();
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  fs::create_directories(dir / "out");
  return dir;
}

fs::path write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  return path;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<int32_t> ids(const std::string& text, bool eod = true) {
  std::vector<int32_t> out(text.begin(), text.end());
  for (int32_t& id : out) id = static_cast<unsigned char>(id);
  if (eod) out.push_back(256);
  return out;
}

TEST(Preprocess, JsonlToDataset) {
  fs::path dir = test_dir();
  write(dir / "in" / "a.jsonl",
        "{\"text\": \"hello\"}\n{\"text\": \"\"}\n{\"text\": \"w\\u00f6rld\"}\n");
  ByteTokenizer tokenizer;
  PreprocessOptions options;
  options.inputs = {dir / "in" / "a.jsonl"};
  options.tokenizer = &tokenizer;
  options.output_prefix = dir / "out" / "ds";
  options.append_eod = true;
  options.workers = 2;
  PreprocessStats stats = preprocess(options);
  EXPECT_EQ(stats.source.documents, 3);  // the empty text too, as Megatron
  EXPECT_EQ(stats.documents_without_tokens, 1);
  EXPECT_EQ(stats.tokens, 5 + 1 + 6 + 1);
  EXPECT_EQ(stats.dtype, IndexedDType::kU16);
  EXPECT_EQ(stats.bin_bytes, 26);
  EXPECT_EQ(stats.source.files, 1);
  EXPECT_EQ(stats.source.bytes, static_cast<int64_t>(fs::file_size(dir / "in" / "a.jsonl")));

  IndexedDataset ds(dir / "out" / "ds");
  ASSERT_EQ(ds.documents(), 3);
  ASSERT_EQ(ds.sequences(), 2);
  EXPECT_EQ(ds.sequence(0), ids("hello"));
  EXPECT_EQ(ds.sequence(1), ids("w\xc3\xb6rld"));

  std::string summary = stats.summary();
  EXPECT_NE(summary.find("3 documents, 13 tokens (u16) from"), std::string::npos) << summary;
  EXPECT_NE(summary.find("(1 without tokens, kept with no sequence)"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("with 2 workers"), std::string::npos) << summary;
}

TEST(Preprocess, WithoutEodAndWithI32) {
  fs::path dir = test_dir();
  write(dir / "in" / "a.txt", "abc");
  ByteTokenizer tokenizer(/*has_eod=*/false, /*vocab=*/70000);
  PreprocessOptions options;
  options.inputs = {dir / "in"};
  options.tokenizer = &tokenizer;
  options.output_prefix = dir / "out" / "ds";
  PreprocessStats stats = preprocess(options);
  EXPECT_EQ(stats.dtype, IndexedDType::kI32);
  IndexedDataset ds(dir / "out" / "ds");
  EXPECT_EQ(ds.dtype(), IndexedDType::kI32);
  EXPECT_EQ(ds.sequence(0), ids("abc", /*eod=*/false));
}

// Many small documents of every kind, in many batches: the files must not depend on the
// number of workers.
TEST(Preprocess, AnyNumberOfWorkersWritesTheSameBytes) {
  fs::path dir = test_dir();
  std::string jsonl, text;
  std::vector<std::string> want;
  for (int i = 0; i < 3000; ++i) {
    std::string doc =
        "document " + std::to_string(i) + std::string(static_cast<size_t>(i % 13), 'x');
    if (i % 97 == 0) {
      jsonl += "not json\n";  // skipped
      continue;
    }
    if (i % 89 == 0) {
      jsonl += "{\"text\": \"  \"}\n";  // whitespace: tokens, kept as Megatron keeps it
      want.push_back("  ");
      continue;
    }
    jsonl += "{\"text\": \"" + doc + "\"}\n";
    want.push_back(doc);
  }
  for (int i = 0; i < 500; ++i) text += "line " + std::to_string(i) + "\n";
  write(dir / "in" / "b" / "data.jsonl", jsonl);
  write(dir / "in" / "a.html", "<p>page &amp; text</p><script>x</script>");
  write(dir / "in" / "c.txt", text);
  want.insert(want.begin(), "page & text");
  for (int i = 0; i < 500; ++i) want.push_back("line " + std::to_string(i));

  ByteTokenizer tokenizer;
  std::string idx_bytes, bin_bytes;
  for (int workers : {1, 2, 3, 8}) {
    PreprocessOptions options;
    options.inputs = {dir / "in"};
    options.source.skip_bad_lines = true;
    options.source.txt_mode = TxtMode::kLine;
    options.tokenizer = &tokenizer;
    options.output_prefix = dir / "out" / ("w" + std::to_string(workers));
    options.append_eod = true;
    options.workers = workers;
    options.batch_bytes = 300;  // many batches
    PreprocessStats stats = preprocess(options);
    EXPECT_EQ(stats.source.documents, static_cast<int64_t>(want.size()));
    EXPECT_EQ(stats.source.bad_lines, 31);
    EXPECT_NE(stats.source.first_bad_line.find("data.jsonl:1: not JSON"), std::string::npos)
        << stats.source.first_bad_line;
    EXPECT_EQ(stats.documents_without_tokens, 0);
    std::string idx = slurp(options.output_prefix.string() + ".idx");
    std::string bin = slurp(options.output_prefix.string() + ".bin");
    if (workers == 1) {
      idx_bytes = idx;
      bin_bytes = bin;
      IndexedDataset ds(options.output_prefix);
      ASSERT_EQ(ds.documents(), static_cast<int64_t>(want.size()));
      for (size_t d = 0; d < want.size(); ++d)
        ASSERT_EQ(ds.sequence(static_cast<int64_t>(d)), ids(want[d])) << d;
    } else {
      EXPECT_EQ(idx, idx_bytes) << workers << " workers";
      EXPECT_EQ(bin, bin_bytes) << workers << " workers";
    }
  }
}

// Only the inputs remain after a failure: nothing at (or beside) the output prefix.
void expect_no_output(const fs::path& dir) { EXPECT_TRUE(fs::is_empty(dir / "out")); }

PreprocessOptions options_for(const fs::path& dir, const Tokenizer& tokenizer) {
  PreprocessOptions options;
  options.inputs = {dir / "in"};
  options.tokenizer = &tokenizer;
  options.output_prefix = dir / "out" / "ds";
  options.workers = 3;
  options.batch_bytes = 64;
  return options;
}

// Megatron's preprocess_data.py keeps every JSONL document: whitespace-only text is tokens
// (+ EOD); a text without tokens is a document with no sequence and no EOD, with or without
// --append-eod. The expected .idx/.bin are written by hand from the format.
TEST(Preprocess, KeepsWhitespaceAndEmptyDocumentsAsMegatron) {
  fs::path dir = test_dir();
  write(dir / "in" / "a.jsonl",
        "{\"text\": \"ab\"}\n{\"text\": \" \"}\n{\"text\": \"\"}\n{\"text\": \"\\n\\t\"}\n"
        "{\"text\": \"\"}\n{\"text\": \"c\"}\n");
  for (bool eod : {false, true}) {
    ByteTokenizer tokenizer;
    PreprocessOptions options = options_for(dir, tokenizer);
    options.output_prefix = dir / "out" / (eod ? "eod" : "plain");
    options.append_eod = eod;
    PreprocessStats stats = preprocess(options);
    EXPECT_EQ(stats.source.documents, 6);
    EXPECT_EQ(stats.documents_without_tokens, 2);
    // Sequences: "ab", " ", "\n\t", "c" (each + EOD); document indices 0 1 2 2 3 3 4.
    std::vector<std::vector<int32_t>> seqs = {ids("ab", eod), ids(" ", eod), ids("\n\t", eod),
                                              ids("c", eod)};
    std::string idx("MMIDIDX\0\0", 9), bin;
    auto put = [](std::string& out, const auto& v) {
      out.append(reinterpret_cast<const char*>(&v), sizeof v);
    };
    put(idx, uint64_t{1});
    idx += static_cast<char>(8);  // u16
    put(idx, uint64_t{4});
    put(idx, uint64_t{7});
    int64_t pointer = 0;
    for (const auto& q : seqs) put(idx, static_cast<int32_t>(q.size()));
    for (const auto& q : seqs) {
      put(idx, pointer);
      pointer += static_cast<int64_t>(2 * q.size());
      for (int32_t t : q) put(bin, static_cast<uint16_t>(t));
    }
    for (int64_t d : {0, 1, 2, 2, 3, 3, 4}) put(idx, d);
    EXPECT_EQ(slurp(options.output_prefix.string() + ".idx"), idx) << "append_eod " << eod;
    EXPECT_EQ(slurp(options.output_prefix.string() + ".bin"), bin) << "append_eod " << eod;
    IndexedDataset ds(options.output_prefix);
    std::printf("append_eod=%d: %lld documents, %lld sequences, %lld tokens\n", eod,
                static_cast<long long>(ds.documents()), static_cast<long long>(ds.sequences()),
                static_cast<long long>(ds.tokens()));
  }
}

TEST(Preprocess, BadLineIsFatalByDefault) {
  fs::path dir = test_dir();
  std::string jsonl;
  for (int i = 0; i < 200; ++i) jsonl += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  jsonl += "{\"txt\": \"oops\"}\n";
  for (int i = 0; i < 200; ++i) jsonl += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  fs::path f = write(dir / "in" / "a.jsonl", jsonl);
  ByteTokenizer tokenizer;
  try {
    preprocess(options_for(dir, tokenizer));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(f.string() + ":201: no key \"text\" (keys: \"txt\")"),
              std::string::npos)
        << e.what();
  }
  expect_no_output(dir);
}

TEST(Preprocess, TokenizerFailureStopsCleanly) {
  fs::path dir = test_dir();
  std::string jsonl;
  for (int i = 0; i < 500; ++i)
    jsonl +=
        "{\"text\": \"doc " + std::string(i == 250 ? "BOOM" : "") + std::to_string(i) + "\"}\n";
  write(dir / "in" / "a.jsonl", jsonl);
  ByteTokenizer tokenizer;
  EXPECT_THROW(preprocess(options_for(dir, tokenizer)), std::runtime_error);
  expect_no_output(dir);
}

TEST(Preprocess, NoDocuments) {
  fs::path dir = test_dir();
  write(dir / "in" / "a.jsonl", "{\"text\": \"\"}\n");
  write(dir / "in" / "b.html", "<script>only</script>");
  ByteTokenizer tokenizer;
  try {
    preprocess(options_for(dir, tokenizer));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no tokens in the inputs (2 files"), std::string::npos)
        << e.what();
  }
  expect_no_output(dir);
}

TEST(Preprocess, TokenizerChecks) {
  fs::path dir = test_dir();
  write(dir / "in" / "a.txt", "abc");
  ByteTokenizer no_eod(/*has_eod=*/false);
  PreprocessOptions options = options_for(dir, no_eod);
  options.append_eod = true;
  try {
    preprocess(options);
    FAIL();
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("no end-of-document token"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("drop --append-eod"), std::string::npos);
  }
  ByteTokenizer huge(true, int64_t{1} << 32);
  try {
    preprocess(options_for(dir, huge));
    FAIL();
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fits no token dtype"), std::string::npos) << e.what();
  }
  options = options_for(dir, no_eod);
  options.tokenizer = nullptr;
  EXPECT_THROW(preprocess(options), loom::Error);
  expect_no_output(dir);
}

TEST(Preprocess, OutputDirectoryMustExist) {
  fs::path dir = test_dir();
  write(dir / "in" / "a.txt", "abc");
  ByteTokenizer tokenizer;
  PreprocessOptions options = options_for(dir, tokenizer);
  options.output_prefix = dir / "missing" / "ds";
  EXPECT_THROW(preprocess(options), IoError);
}

TEST(Preprocess, MissingInput) {
  fs::path dir = test_dir();
  ByteTokenizer tokenizer;
  PreprocessOptions options = options_for(dir, tokenizer);
  options.inputs = {dir / "in" / "nope.jsonl"};
  EXPECT_THROW(preprocess(options), IoError);
  expect_no_output(dir);
}

}  // namespace
}  // namespace loom::core
