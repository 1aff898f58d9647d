// Byte-level BPE: pre-tokenisation against the GPT-2 / Llama-3 regex semantics, the merge
// order, round trips of arbitrary bytes, training, and the messages for malformed files.
// (tests/reference/tokenizer_hf_test compares ids with Hugging Face `tokenizers`.)
#include "core/data/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/data/bpe.h"
#include "core/data/bpe_trainer.h"
#include "core/data/pretokenize.h"
#include "core/data/unicode.h"
#include "core/util/errors.h"

namespace loom::core {
namespace {

namespace fs = std::filesystem;

using Pieces = std::vector<std::string>;

Pieces split(PreTokenPattern p, std::string_view text) {
  Pieces out;
  for (std::string_view s : pretokenize(p, text)) out.emplace_back(s);
  return out;
}

fs::path temp_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : fs::temp_directory_path().string()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The message of the IoError `fn` throws ("" when it throws none).
template <class Fn>
std::string io_error(Fn&& fn) {
  try {
    fn();
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

// vocab.json: the 256 bytes in GPT-2's order, then `extra` tokens in order.
std::string vocab_json(const std::vector<std::string>& extra) {
  std::string json = "{";
  int id = 0;
  auto add = [&](const std::string& token) {
    std::string escaped;
    for (char c : token) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    json += id == 0 ? "\"" : ", \"";
    json += escaped + "\": " + std::to_string(id);
    ++id;
  };
  for (uint8_t b : gpt2_byte_order())
    add(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
  for (const std::string& t : extra) add(t);
  return json + "}";
}

// A hand-made vocabulary: ids 256.. are aa, aaa, Ġh, Ġhe, ll, Ġhell, Ġhello, <|endoftext|>.
fs::path tiny_tokenizer() {
  fs::path dir = temp_dir("tiny_bpe");
  write(dir / "vocab.json",
        vocab_json({"aa", "aaa", "Ġh", "Ġhe", "ll", "Ġhell", "Ġhello", "<|endoftext|>"}));
  write(dir / "merges.txt", "#version: 0.2\na a\naa a\nĠ h\nĠh e\nl l\nĠhe ll\nĠhell o\n");
  return dir;
}

TEST(Unicode, Classes) {
  using unicode::CharClass;
  EXPECT_EQ(unicode::char_class('a'), CharClass::kLetter);
  EXPECT_EQ(unicode::char_class(0x65E5), CharClass::kLetter);   // 日
  EXPECT_EQ(unicode::char_class(0x0663), CharClass::kNumber);   // Arabic-Indic 3
  EXPECT_EQ(unicode::char_class(0x00BD), CharClass::kNumber);   // ½
  EXPECT_EQ(unicode::char_class(0x3000), CharClass::kSpace);    // ideographic space
  EXPECT_EQ(unicode::char_class(0x0085), CharClass::kSpace);    // next line
  EXPECT_EQ(unicode::char_class(0x200B), CharClass::kOther);    // zero width space: not \s
  EXPECT_EQ(unicode::char_class(0x0301), CharClass::kOther);    // combining acute
  EXPECT_EQ(unicode::char_class(0x1F600), CharClass::kOther);   // 😀
  EXPECT_EQ(unicode::char_class(0x105C0), CharClass::kLetter);  // Todhri (Unicode 16)
  EXPECT_EQ(unicode::char_class(unicode::kInvalidCodePoint), CharClass::kOther);
  EXPECT_STREQ(unicode::unicode_version(), "16.0.0");
}

TEST(Unicode, DecodesInvalidBytesOneByOne) {
  for (std::string bad :
       {"\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "\xFF"}) {
    unicode::Utf8Char c = unicode::decode_utf8(bad.data(), bad.data() + bad.size());
    EXPECT_EQ(c.cp, unicode::kInvalidCodePoint) << bad;
    EXPECT_EQ(c.len, 1u);
  }
  std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(unicode::decode_utf8(euro.data(), euro.data() + 3).cp, 0x20ACu);
}

// Expected splits are those of `tokenizers` 0.23.3 (ByteLevel use_regex; Split with the
// Llama-3 pattern).
TEST(PreTokenize, Gpt2) {
  auto g = [](std::string_view s) { return split(PreTokenPattern::kGpt2, s); };
  EXPECT_EQ(g("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(g("\t\tfoo"), (Pieces{"\t", "\t", "foo"}));  // " ?" takes only a space
  EXPECT_EQ(g("a  b"), (Pieces{"a", " ", " b"}));        // \s+(?!\S) leaves the last space
  EXPECT_EQ(g("a \t b"), (Pieces{"a", " \t", " b"}));
  EXPECT_EQ(g("a   "), (Pieces{"a", "   "}));  // a run at the end stays whole
  EXPECT_EQ(g("x\r\ny"), (Pieces{"x", "\r", "\n", "y"}));
  EXPECT_EQ(g("don't It'S"), (Pieces{"don", "'t", " It", "'", "S"}));  // 'S: no contraction
  EXPECT_EQ(g("we'll they're I've I'm he'd"),
            (Pieces{"we", "'ll", " they", "'re", " I", "'ve", " I", "'m", " he", "'d"}));
  EXPECT_EQ(g("''s x.'s"), (Pieces{"''", "s", " x", ".'", "s"}));
  EXPECT_EQ(g(" 123 4x"), (Pieces{" 123", " 4", "x"}));
  EXPECT_EQ(g("'ſx"), (Pieces{"'", "ſx"}));
  EXPECT_EQ(g("héllo wörld!!"), (Pieces{"héllo", " wörld", "!!"}));
  EXPECT_EQ(g("a\u00a0b"), (Pieces{"a", "\u00a0", "b"}));
  EXPECT_EQ(g("\u3000x"), (Pieces{"\u3000", "x"}));
  EXPECT_EQ(g("e\u0301"), (Pieces{"e", "\u0301"}));  // a combining mark is not a letter
  EXPECT_EQ(g("a\xff\xfe"
              "b \xc3"),
            (Pieces{"a", "\xff\xfe", "b", " \xc3"}));
  EXPECT_EQ(g(""), (Pieces{}));
}

TEST(PreTokenize, Llama3) {
  auto l = [](std::string_view s) { return split(PreTokenPattern::kLlama3, s); };
  EXPECT_EQ(l("'ſx"), (Pieces{"'ſ", "x"}));  // (?i) folds ſ to s
  EXPECT_EQ(l("'Sx 'LL"), (Pieces{"'S", "x", " '", "LL"}));
  EXPECT_EQ(l("a \r\n\r\n b"), (Pieces{"a", " \r\n\r\n", " b"}));
  EXPECT_EQ(l("12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(l("!!\n\nx"), (Pieces{"!!\n\n", "x"}));
  EXPECT_EQ(l("  \n  x"), (Pieces{"  \n", " ", " x"}));
  EXPECT_EQ(l("(hello\tworld"), (Pieces{"(hello", "\tworld"}));
  EXPECT_EQ(l("\nword"), (Pieces{"\n", "word"}));
}

TEST(PreTokenize, PiecesCoverRandomBytes) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? "  \t\n'sa1"[rng() % 8] : rng());
    for (PreTokenPattern p : {PreTokenPattern::kGpt2, PreTokenPattern::kLlama3}) {
      std::string joined;
      for (std::string_view piece : pretokenize(p, s)) {
        ASSERT_FALSE(piece.empty());
        joined += piece;
      }
      ASSERT_EQ(joined, s);
    }
  }
}

TEST(Bpe, ByteTable) {
  EXPECT_EQ(bytes_to_byte_level(" hello\n"), "ĠhelloĊ");
  EXPECT_EQ(gpt2_byte_order()[0], '!');
  std::string back;
  EXPECT_TRUE(byte_level_to_bytes("ĠhelloĊ", back));
  EXPECT_EQ(back, " hello\n");
  EXPECT_FALSE(byte_level_to_bytes("日", back));
}

TEST(Bpe, ScanAndHeapAgree) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    // Random merges over 4 base symbols; merged ids from 4 on.
    BpeMerges merges;
    int next = 4;
    for (int k = 0; k < 12; ++k) {
      auto left = static_cast<int32_t>(rng() % next);
      auto right = static_cast<int32_t>(rng() % next);
      merges.insert(left, right, {k, next});
      ++next;
    }
    for (int w = 0; w < 20; ++w) {
      std::vector<int32_t> a(rng() % 80);
      for (int32_t& s : a) s = static_cast<int32_t>(rng() % 4);
      std::vector<int32_t> b = a;
      bpe_merge_scan(merges, a);
      bpe_merge_heap(merges, b);
      ASSERT_EQ(a, b);
    }
  }
}

TEST(Tokenizer, HandMadeVocabulary) {
  auto t = Tokenizer::load(tiny_tokenizer());
  using Ids = std::vector<int32_t>;
  const int32_t a = 64;  // 'a' in GPT-2's byte order
  EXPECT_EQ(t->encode("aaa"), (Ids{257}));
  EXPECT_EQ(t->encode("aaaa"), (Ids{256, 256}));  // lowest rank first: (a a) before (aa a)
  EXPECT_EQ(t->encode("aaaaa"), (Ids{256, 257}));
  EXPECT_EQ(t->encode("a<|endoftext|>aa"), (Ids{a, 263, 256}));
  EXPECT_EQ(t->encode(" hello"), (Ids{262}));
  EXPECT_EQ(t->encode(" hell"), (Ids{261}));
  EXPECT_EQ(t->encode("hello"), (Ids{71, 68, 260, 78}));
  EXPECT_EQ(t->vocab_size(), 264);
  EXPECT_EQ(t->eod(), 263);
  EXPECT_EQ(t->token_to_id("Ġhello"), 262);
  EXPECT_EQ(t->id_to_token(262), "Ġhello");
  EXPECT_EQ(t->decode({262, 263, 256}), " hello<|endoftext|>aa");
  try {
    t->decode({264});
    FAIL() << "decode of an id past the vocabulary";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
  }
  EXPECT_NE(t->describe().find("264 tokens"), std::string::npos) << t->describe();
}

TEST(Tokenizer, VocabularyWithAModelToken) {
  // A vocab.json is told from a tokenizer.json by its "model" being an object, not by the key.
  fs::path dir = temp_dir("model_token");
  write(dir / "vocab.json", vocab_json({"model"}));
  write(dir / "merges.txt", "#version: 0.2\n");
  auto t = Tokenizer::load(dir / "vocab.json");
  EXPECT_EQ(t->vocab_size(), 257);
  EXPECT_EQ(t->encode("a model"), (std::vector<int32_t>{64, 220, 256}));  // "model" is special
}

TEST(Tokenizer, RoundTripsAnyBytes) {
  auto t = Tokenizer::load(tiny_tokenizer());
  std::mt19937 rng(11);
  const std::vector<std::string> parts = {
      "a", "aa",     " hello",        "\t",     "\n", " ", "'s", "日本",
      "😀", "\u0301", "<|endoftext|>", "<|endo", "1"};
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) {
      if (rng() % 3 == 0)
        s += static_cast<char>(rng());  // often invalid UTF-8
      else
        s += parts[rng() % parts.size()];
    }
    std::vector<int32_t> ids = t->encode(s);
    ASSERT_EQ(t->decode(ids), s);
    std::vector<int32_t> appended = {7};
    t->encode_into(s, appended);
    ASSERT_EQ(std::vector<int32_t>(appended.begin() + 1, appended.end()), ids);
  }
}

TEST(Tokenizer, SharedBetweenThreads) {
  auto t = Tokenizer::load(tiny_tokenizer());
  std::string text;
  for (int i = 0; i < 2000; ++i) text += " hello aaa<|endoftext|>" + std::to_string(i);
  std::vector<int32_t> expected = t->encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = t->encode(text); });
  for (std::thread& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

std::vector<std::string> corpus() {
  std::mt19937 rng(5);
  const std::vector<std::string> words = {"the", "cat", "sat",  "on",    "mat", "and", "dog's",
                                          "ran", "42",  "日本", "naïve", "!",   "\n",  "don't"};
  std::vector<std::string> docs;
  for (int d = 0; d < 50; ++d) {
    std::string doc;
    for (int w = 0; w < 300; ++w) doc += (w ? " " : "") + words[rng() % words.size()];
    docs.push_back(doc);
  }
  return docs;
}

TEST(Trainer, DeterministicAndExactSize) {
  std::vector<std::string> docs = corpus();
  std::vector<std::string_view> views(docs.begin(), docs.end());
  BpeTrainOptions options;
  options.vocab_size = 300;
  options.special_tokens = {"<|endoftext|>", "<|pad|>"};
  BpeVocabulary a = learn_bpe(views, options);
  BpeVocabulary b = learn_bpe(views, options);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  ASSERT_EQ(a.tokens.size(), 300u);
  EXPECT_EQ(a.tokens[298], "<|endoftext|>");
  EXPECT_EQ(a.special_begin, 298);
  EXPECT_EQ(count_words(views, {}, 1), count_words(views, {}, 2));

  fs::path dir = temp_dir("trained_bpe");
  train_bpe(views, options, dir);
  auto t = Tokenizer::load(dir);
  EXPECT_EQ(t->vocab_size(), 300);
  EXPECT_EQ(t->eod(), 298);
  EXPECT_EQ(t->token_to_id("<|pad|>"), 299);
  EXPECT_EQ(t->encode(" the"), (std::vector<int32_t>{*t->token_to_id("Ġthe")}));
  for (const std::string& d : docs) EXPECT_EQ(t->decode(t->encode(d)), d);
  EXPECT_EQ(t->encode("cat<|endoftext|>"), (std::vector<int32_t>{*t->token_to_id("cat"), 298}));
}

TEST(Trainer, StopsAtMinFrequencyAndRefusesTooSmall) {
  std::vector<std::string_view> docs = {"ab ab ab cd"};
  BpeTrainOptions options;
  options.vocab_size = 1000;
  options.special_tokens = {};
  BpeVocabulary v = learn_bpe(docs, options);
  // (a, b) x3, (Ġ, ab) x2, (Ġab?)... only pairs seen twice are merged.
  for (const auto& [l, r] : v.merges) EXPECT_NE(v.tokens[l] + v.tokens[r], "cd");
  EXPECT_LT(v.tokens.size(), 1000u);
  options.vocab_size = 100;
  EXPECT_THROW(learn_bpe(docs, options), Error);
}

TEST(Load, MalformedFiles) {
  fs::path dir = temp_dir("malformed");
  // A vocab.json without its merges.txt.
  write(dir / "vocab.json", vocab_json({}));
  std::string msg = io_error([&] { Tokenizer::load(dir); });
  EXPECT_NE(msg.find("merges.txt"), std::string::npos) << msg;

  // Not JSON.
  fs::path bad = temp_dir("bad_json");
  write(bad / "vocab.json", "{\"a\": 0,");
  write(bad / "merges.txt", "#version: 0.2\n");
  msg = io_error([&] { Tokenizer::load(bad / "vocab.json"); });
  EXPECT_NE(msg.find((bad / "vocab.json").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;

  // A merge naming a token that is not in the vocabulary.
  write(dir / "merges.txt", "#version: 0.2\na b\nzz q\n");
  write(dir / "vocab.json", vocab_json({"ab"}));
  msg = io_error([&] { Tokenizer::load(dir); });
  EXPECT_NE(msg.find("merges.txt:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'zz'"), std::string::npos) << msg;

  // A merge whose result is missing; a malformed line.
  write(dir / "merges.txt", "#version: 0.2\na c\n");
  msg = io_error([&] { Tokenizer::load(dir); });
  EXPECT_NE(msg.find("merged token 'ac'"), std::string::npos) << msg;
  write(dir / "merges.txt", "#version: 0.2\nabc\n");
  msg = io_error([&] { Tokenizer::load(dir); });
  EXPECT_NE(msg.find("merges.txt:2"), std::string::npos) << msg;

  // A vocabulary without every byte.
  write(dir / "vocab.json", "{\"a\": 0, \"b\": 1}");
  write(dir / "merges.txt", "#version: 0.2\na b\n");
  msg = io_error([&] { Tokenizer::load(dir); });
  EXPECT_NE(msg.find("byte tokens are missing"), std::string::npos) << msg;

  // Nothing there.
  msg = io_error([&] { Tokenizer::load(dir / "nope"); });
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
}

std::string tokenizer_json(const std::string& model_extra, const std::string& pre_tokenizer) {
  std::string vocab = vocab_json({});
  return "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": " +
         pre_tokenizer + ", \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {" + model_extra +
         "\"vocab\": " + vocab + ", \"merges\": []}}";
}

TEST(Load, TokenizerJsonRefusals) {
  fs::path dir = temp_dir("tokenizer_json");
  fs::path file = dir / "tokenizer.json";
  const std::string byte_level = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}";
  write(file, tokenizer_json("\"type\": \"BPE\", ", byte_level));
  EXPECT_EQ(Tokenizer::load(dir)->vocab_size(), 256);

  write(file, tokenizer_json("\"type\": \"WordPiece\", ", byte_level));
  std::string msg = io_error([&] { Tokenizer::load(file); });
  EXPECT_NE(msg.find("model type 'WordPiece' is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;

  write(file, tokenizer_json("\"type\": \"BPE\", \"dropout\": 0.1, ", byte_level));
  msg = io_error([&] { Tokenizer::load(file); });
  EXPECT_NE(msg.find("dropout"), std::string::npos) << msg;

  write(file,
        tokenizer_json("\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", ", byte_level));
  msg = io_error([&] { Tokenizer::load(file); });
  EXPECT_NE(msg.find("continuing_subword_prefix"), std::string::npos) << msg;

  write(file, tokenizer_json("\"type\": \"BPE\", ",
                             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                             "\"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}, " +
                                 byte_level + "]}"));
  msg = io_error([&] { Tokenizer::load(file); });
  EXPECT_NE(msg.find("\\\\w+"), std::string::npos) << msg;
  EXPECT_NE(msg.find("GPT-2"), std::string::npos) << msg;

  write(file, tokenizer_json("\"type\": \"BPE\", ", "{\"type\": \"Whitespace\"}"));
  msg = io_error([&] { Tokenizer::load(file); });
  EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
}

// Outside JSON that used to crash loom (issue "Reliability II"): each is one IoError naming
// the file and the place, never a signal, std::bad_alloc or nlohmann's exception.
TEST(Load, DeepOrOverflowingJsonIsACleanError) {
  fs::path dir = temp_dir("deep_json");
  write(dir / "merges.txt", "#version: 0.2\n");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write(dir / "vocab.json", deep);
  std::string msg = io_error([&] { Tokenizer::load(dir / "vocab.json"); });
  std::printf("deep vocab.json: %s\n", msg.c_str());
  EXPECT_NE(msg.find((dir / "vocab.json").string() + ":1:257: JSON nested deeper than 256"),
            std::string::npos)
      << msg;
  write(dir / "vocab.json", "{\"a\": 1e309}");
  msg = io_error([&] { Tokenizer::load(dir / "vocab.json"); });
  EXPECT_NE(msg.find("number overflow"), std::string::npos) << msg;
  // tokenizer.json and the tokenizer_config.json read beside it.
  write(dir / "tokenizer.json", "{\"model\": " + deep + "}");
  msg = io_error([&] { Tokenizer::load(dir / "tokenizer.json"); });
  EXPECT_NE(msg.find((dir / "tokenizer.json").string() + ":1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nested deeper"), std::string::npos) << msg;
  write(dir / "vocab.json", vocab_json({}));
  write(dir / "tokenizer_config.json", "{\"eos_token\": " + deep + "}");
  msg = io_error([&] { Tokenizer::load(dir / "vocab.json"); });
  EXPECT_NE(msg.find((dir / "tokenizer_config.json").string() + ":1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nested deeper"), std::string::npos) << msg;
}

TEST(Load, WrongTypesInTokenizerJsonNameTheFileAndPointer) {
  fs::path dir = temp_dir("wrong_types");
  fs::path file = dir / "tokenizer.json";
  const std::string byte_level = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}";
  auto with_split = [&](const std::string& behavior) {
    return tokenizer_json("\"type\": \"BPE\", ",
                          "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                          "\"pattern\": {\"Regex\": " +
                              nlohmann::json(std::string(kGpt2Pattern)).dump() +
                              "}, \"behavior\": " + behavior + "}, " + byte_level + "]}");
  };
  // The control: the same file with a good behavior loads.
  write(file, with_split("\"Isolated\""));
  EXPECT_EQ(Tokenizer::load(file)->vocab_size(), 256);
  struct Case {
    std::string text;
    std::string message;
  };
  std::string added_ok = "\"added_tokens\": []";
  std::string good = tokenizer_json("\"type\": \"BPE\", ", byte_level);
  auto replace = [&](std::string text, const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const std::vector<Case> cases = {
      {with_split("[]"), "/pre_tokenizer/pretokenizers/0/behavior: expected a string, got []"},
      {with_split("1.5"), "/pre_tokenizer/pretokenizers/0/behavior: expected a string, got 1.5"},
      {replace(good, added_ok, "\"added_tokens\": \"x\""),
       "/added_tokens: expected an array, got \"x\""},
      {replace(good, added_ok, "\"added_tokens\": [{\"id\": \"7\", \"content\": \"<s>\"}]"),
       "/added_tokens/0/id: expected an integer, got \"7\""},
      {replace(good, added_ok, "\"added_tokens\": [{\"id\": 4294967296, \"content\": \"<s>\"}]"),
       "/added_tokens/0/id: integer 4294967296 is outside [0, 2147483647]"},
      {replace(good, added_ok,
               "\"added_tokens\": [{\"id\": 300, \"content\": \"<s>\", \"special\": \"yes\"}]"),
       "/added_tokens/0/special: expected true or false, got \"yes\""},
      {replace(good, "\"merges\": []", "\"merges\": {}"), "/model/merges: expected an array"},
      {replace(good, "\"merges\": []", "\"merges\": [3]"),
       "/model/merges/0: expected a merge \"left right\""},
      {replace(good, "\"vocab\": {", "\"vocab\": {\"zz\": \"x\", "),
       "/model/vocab/zz: expected an integer, got \"x\""},
      {replace(good, "\"type\": \"BPE\"", "\"type\": 5"), "/model/type: expected a string"},
  };
  for (const Case& c : cases) {
    write(file, c.text);
    std::string msg = io_error([&] { Tokenizer::load(file); });
    std::printf("%s\n", msg.c_str());
    EXPECT_NE(msg.find(file.string() + ": " + c.message), std::string::npos) << msg;
  }
}

TEST(Load, IdsAreBoundedByTheFile) {
  // vocab.json: the 256 bytes (ids 0..255) and one more token "zq" with the id under test.
  // The rule: ids below 2 x tokens + 1024 = 2 x 257 + 1024 = 1538.
  fs::path dir = temp_dir("huge_ids");
  write(dir / "merges.txt", "#version: 0.2\n");
  auto with_x = [&](int64_t id) {
    std::string text = vocab_json({});
    text.pop_back();  // '}'
    write(dir / "vocab.json", text + ", \"zq\": " + std::to_string(id) + "}");
  };
  with_x(1537);  // the largest id allowed: holes are fine
  EXPECT_EQ(Tokenizer::load(dir / "vocab.json")->vocab_size(), 1538);
  for (int64_t id : {int64_t{1538}, int64_t{20000000}, int64_t{2147483647}}) {
    // Before the bound, 2147483647 ended in std::bad_alloc and 2e7 allocated 805 MB.
    with_x(id);
    std::string msg = io_error([&] { Tokenizer::load(dir / "vocab.json"); });
    std::printf("id %lld: %s\n", static_cast<long long>(id), msg.c_str());
    EXPECT_NE(msg.find((dir / "vocab.json").string() + ": token \"zq\" has the id " +
                       std::to_string(id) + "; ids must be below 1538"),
              std::string::npos)
        << msg;
  }
  // Added tokens count, and are bounded alike (tokenizer.json).
  fs::path file = dir / "tokenizer.json";
  std::string text = tokenizer_json("\"type\": \"BPE\", ",
                                    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}");
  std::string added = "\"added_tokens\": [";
  for (int k = 0; k < 3; ++k)
    added += (k ? ", " : "") + std::string("{\"id\": ") + std::to_string(256 + k) +
             ", \"content\": \"<t" + std::to_string(k) + ">\", \"special\": true}";
  std::string ok = added + ", {\"id\": 1541, \"content\": \"<last>\", \"special\": true}]";
  write(file, text.replace(text.find("\"added_tokens\": []"), 18, ok));  // 260 tokens: < 1544
  EXPECT_EQ(Tokenizer::load(file)->vocab_size(), 1542);
  text = tokenizer_json("\"type\": \"BPE\", ",
                        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}");
  std::string bad = added + ", {\"id\": 1544, \"content\": \"<last>\", \"special\": true}]";
  write(file, text.replace(text.find("\"added_tokens\": []"), 18, bad));
  std::string msg = io_error([&] { Tokenizer::load(file); });
  EXPECT_NE(msg.find("added token \"<last>\" has the id 1544; ids must be below 1544"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace loom::core
