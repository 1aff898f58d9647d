// loom tokenizer train | encode | decode | bench | info: byte-level BPE tokenizers (GPT-2
// vocab.json + merges.txt, Hugging Face tokenizer.json).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/data/bpe_trainer.h"
#include "core/data/text_source.h"
#include "core/data/tokenizer.h"
#include "core/schema/did_you_mean.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "loom/cpp/json_input.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The bytes of FILE, or of standard input for "-".
std::string read_input(const std::string& file) {
  if (file != "-") return core::read_file(file);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// Calls `fn(line_number, json)` for every non-empty line of a JSON-lines text.
template <class Fn>
void for_each_json_line(const std::string& text, const std::string& file, Fn&& fn) {
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j;
    try {
      // Depth cap, numbers beyond double, syntax: one message with the line's column.
      j = parse_json_input(line, file, Code::kIoError,
                           "not valid JSON; write one JSON value per line");
    } catch (const Error& e) {
      // The line was parsed alone: "FILE:1:COLUMN: ..." becomes "FILE:LINE:COLUMN: ...".
      std::string message = e.what();
      const std::string alone = file + ":1:";
      if (message.rfind(alone, 0) == 0)
        message = fmt::format("{}:{}:{}", file, line_no, message.substr(alone.size()));
      throw core::IoError(message);
    }
    fn(line_no, j);
  }
}

std::string text_of(const nlohmann::json& j, const std::string& key, const std::string& file,
                    int64_t line_no) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    throw core::IoError(
        fmt::format("{}:{}: no string \"{}\" in this line (name the text's key "
                    "with --json-key)",
                    file, line_no, key));
  return j[key].get<std::string>();
}

std::unique_ptr<core::Tokenizer> open_tokenizer(const Args& args, const std::string& usage) {
  std::string path = args.get("--tokenizer");
  if (path.empty()) throw core::UsageError("--tokenizer PATH is required\nusage: " + usage);
  return core::Tokenizer::load(path);
}

int tokenizer_train(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom tokenizer train --vocab-size N [--min-frequency F] [--special-token T]... "
      "[--json-key K] --output DIR CORPUS... (files or directories of .txt, .jsonl, .html)";
  Args args = parse_args(argv, {{},
                                {"--vocab-size", "--min-frequency", "--special-token", "--json-key",
                                 "--output", "--plugin-path"},
                                1,
                                1 << 20,
                                usage});
  core::BpeTrainOptions options;
  options.vocab_size = args.integer("--vocab-size", -1);
  if (options.vocab_size < 0) throw core::UsageError("--vocab-size N is required\nusage: " + usage);
  options.min_frequency = args.integer("--min-frequency", 2);
  if (args.values.count("--special-token")) options.special_tokens = args.all("--special-token");
  options.progress = isatty(2);
  std::string out = args.get("--output");
  if (out.empty()) throw core::UsageError("--output DIR is required\nusage: " + usage);
  std::string key = args.get("--json-key", "text");

  // Files and directories of .txt, .jsonl and .html documents, read as `loom preprocess`
  // reads them.
  auto t0 = Clock::now();
  std::vector<std::string> storage;
  core::TextSourceOptions source;
  source.json_key = key;
  std::vector<fs::path> inputs(args.positionals.begin(), args.positionals.end());
  core::TextSourceStats stats = core::for_each_document(
      inputs, source,
      [&](std::string_view text, const core::DocumentOrigin&) { storage.emplace_back(text); });
  std::vector<std::string_view> documents(storage.begin(), storage.end());
  size_t bytes = 0;
  for (std::string_view d : documents) bytes += d.size();
  std::printf("loom tokenizer train: %lld file(s), %zu document(s), %.1f MB read in %.1f s\n",
              static_cast<long long>(stats.files), documents.size(),
              static_cast<double>(bytes) / 1e6, seconds_since(t0));
  std::fflush(stdout);

  auto t1 = Clock::now();
  core::BpeVocabulary vocab;
  try {
    vocab = core::learn_bpe(documents, options);
  } catch (const Error& e) {
    if (e.code() != Code::kInvalidArgument) throw;
    throw core::UsageError(fmt::format("{}\nusage: {}", e.what(), usage));  // size, specials
  }
  double train_s = seconds_since(t1);
  core::write_gpt2_files(vocab, out);
  std::printf(
      "learnt %zu merges in %.1f s (word counts included); %zu tokens (256 bytes, %zu "
      "merges, %zu special)\n",
      vocab.merges.size(), train_s, vocab.tokens.size(), vocab.merges.size(),
      options.special_tokens.size());
  if (static_cast<int64_t>(vocab.tokens.size()) < options.vocab_size)
    std::printf(
        "note: asked for %lld tokens, but no further pair occurs %lld times in this corpus "
        "(more text or a lower --min-frequency gives more)\n",
        static_cast<long long>(options.vocab_size), static_cast<long long>(options.min_frequency));
  std::printf("wrote %s and %s\n", (fs::path(out) / "vocab.json").string().c_str(),
              (fs::path(out) / "merges.txt").string().c_str());
  return core::kExitOk;
}

std::string ids_line(const std::vector<int32_t>& ids, bool json) {
  if (json) return nlohmann::json(ids).dump();
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += fmt::format("{}{}", i ? " " : "", ids[i]);
  return s;
}

int tokenizer_encode(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom tokenizer encode --tokenizer PATH [TEXT | --file F] [--json] [--jsonl "
      "[--json-key K]]";
  Args args = parse_args(argv, {{"--json", "--jsonl"},
                                {"--tokenizer", "--file", "--json-key", "--plugin-path"},
                                0,
                                1,
                                usage});
  bool has_file = !args.get("--file").empty();
  if (has_file == !args.positionals.empty())
    throw core::UsageError("give the text or --file F (one of the two)\nusage: " + usage);
  if (args.flag("--jsonl") && !has_file)
    throw core::UsageError("--jsonl reads JSON lines from --file F\nusage: " + usage);
  auto tokenizer = open_tokenizer(args, usage);
  if (args.flag("--jsonl")) {
    // One JSON array of ids per input line.
    std::string file = args.get("--file");
    std::string key = args.get("--json-key", "text");
    std::string text = read_input(file);
    std::vector<int32_t> ids;
    for_each_json_line(text, file, [&](int64_t line_no, const nlohmann::json& j) {
      ids.clear();
      tokenizer->encode_into(text_of(j, key, file, line_no), ids);
      std::printf("%s\n", ids_line(ids, true).c_str());
    });
    return core::kExitOk;
  }
  std::string text = has_file ? read_input(args.get("--file")) : args.positionals[0];
  std::printf("%s\n", ids_line(tokenizer->encode(text), args.flag("--json")).c_str());
  return core::kExitOk;
}

std::vector<int32_t> parse_ids(const std::vector<std::string>& words, const std::string& usage) {
  std::vector<int32_t> ids;
  for (const std::string& w : words) {
    // Accept "1 2 3", "1,2,3" and "[1, 2, 3]".
    std::string token;
    auto flush = [&] {
      if (token.empty()) return;
      try {
        size_t used = 0;
        long long v = std::stoll(token, &used);
        if (used != token.size() || v < INT32_MIN || v > INT32_MAX)
          throw std::invalid_argument(token);
        ids.push_back(static_cast<int32_t>(v));
      } catch (const std::exception&) {
        throw core::UsageError(fmt::format("'{}' is not a token id\nusage: {}", token, usage));
      }
      token.clear();
    };
    for (char c : w) {
      if (c == ',' || c == '[' || c == ']' || c == ' ')
        flush();
      else
        token += c;
    }
    flush();
  }
  return ids;
}

int tokenizer_decode(const std::vector<std::string>& argv) {
  const std::string usage = "loom tokenizer decode --tokenizer PATH (IDS... | --jsonl F)";
  Args args =
      parse_args(argv, {{}, {"--tokenizer", "--jsonl", "--plugin-path"}, 0, 1 << 20, usage});
  auto tokenizer = open_tokenizer(args, usage);
  std::string file = args.get("--jsonl");
  if (!file.empty()) {
    // Each line a JSON array of ids; prints {"text": ...} per line (bytes that are not UTF-8
    // become U+FFFD there).
    std::string text = read_input(file);
    for_each_json_line(text, file, [&](int64_t line_no, const nlohmann::json& j) {
      if (!j.is_array())
        throw core::IoError(fmt::format("{}:{}: expected a JSON array of ids", file, line_no));
      std::vector<int32_t> ids;
      try {
        // Every element an integer that fits an id (the vocabulary checks the rest).
        for (int64_t id : JsonIn(j, fmt::format("{}:{}", file, line_no), Code::kIoError)
                              .int64_array(INT32_MIN, INT32_MAX))
          ids.push_back(static_cast<int32_t>(id));
      } catch (const Error& e) {
        throw core::IoError(e.what());
      }
      std::string decoded = tokenizer->decode(ids);
      nlohmann::json out = {{"text", decoded}};
      std::printf("%s\n",
                  out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    });
    return core::kExitOk;
  }
  if (args.positionals.empty()) throw core::UsageError("give token ids\nusage: " + usage);
  std::string bytes;
  try {
    bytes = tokenizer->decode(parse_ids(args.positionals, usage));
  } catch (const Error& e) {
    if (e.code() != Code::kInvalidArgument) throw;
    throw core::UsageError(e.what());  // an id the vocabulary does not have
  }
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  if (isatty(1)) std::fputc('\n', stdout);
  return core::kExitOk;
}

int tokenizer_bench(const std::vector<std::string>& argv) {
  const std::string usage = "loom tokenizer bench --tokenizer PATH FILE [--repeat N] [--json]";
  Args args =
      parse_args(argv, {{"--json"}, {"--tokenizer", "--repeat", "--plugin-path"}, 1, 1, usage});
  int64_t repeat = args.integer("--repeat", 3, 1);
  auto tokenizer = open_tokenizer(args, usage);
  std::string text = core::read_file(args.positionals[0]);
  double mb = static_cast<double>(text.size()) / 1e6;
  // One thread. The first pass starts with an empty word cache; the later ones find the
  // frequent words cached, as a long preprocessing run does.
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 2);
  auto t0 = Clock::now();
  tokenizer->encode_into(text, ids);
  double cold = seconds_since(t0);
  size_t tokens = ids.size();
  double warm = 1e30;
  for (int64_t i = 0; i < repeat; ++i) {
    ids.clear();
    auto t1 = Clock::now();
    tokenizer->encode_into(text, ids);
    warm = std::min(warm, seconds_since(t1));
  }
  auto t2 = Clock::now();
  std::string back = tokenizer->decode(ids);
  double decode_s = seconds_since(t2);
  if (back != text)
    throw Error(Code::kInternal, "decode(encode(text)) differs from the text; please report it");
  if (args.flag("--json")) {
    nlohmann::json out = {{"tokenizer", tokenizer->describe()},
                          {"file", args.positionals[0]},
                          {"bytes", text.size()},
                          {"tokens", tokens},
                          {"encode_mb_per_s_cold", mb / cold},
                          {"encode_mb_per_s", mb / warm},
                          {"decode_mb_per_s", mb / decode_s}};
    std::printf("%s\n", out.dump(2).c_str());
    return core::kExitOk;
  }
  std::printf("loom tokenizer bench: %s\n  %s: %.2f MB, %zu tokens (%.2f bytes/token)\n",
              tokenizer->describe().c_str(), args.positionals[0].c_str(), mb, tokens,
              static_cast<double>(text.size()) / static_cast<double>(std::max<size_t>(1, tokens)));
  std::printf(
      "  encode, one thread: %.1f MB/s (best of %lld warm passes); %.1f MB/s cold "
      "(first pass, empty cache)\n  decode: %.1f MB/s\n",
      mb / warm, static_cast<long long>(repeat), mb / cold, mb / decode_s);
  return core::kExitOk;
}

int tokenizer_info(const std::vector<std::string>& argv) {
  const std::string usage = "loom tokenizer info --tokenizer PATH";
  Args args = parse_args(argv, {{}, {"--tokenizer", "--plugin-path"}, 0, 0, usage});
  auto tokenizer = open_tokenizer(args, usage);
  std::printf("%s\n  vocab size: %lld\n", tokenizer->describe().c_str(),
              static_cast<long long>(tokenizer->vocab_size()));
  if (std::optional<int32_t> eod = tokenizer->eod())
    std::printf("  end of document: %d '%s'\n", *eod, tokenizer->id_to_token(*eod).c_str());
  else
    std::printf("  end of document: none\n");
  return core::kExitOk;
}

}  // namespace

int cmd_tokenizer(const std::vector<std::string>& argv) {
  const std::string usage = "loom tokenizer train|encode|decode|bench|info ...";
  if (argv.empty()) throw core::UsageError("missing subcommand\nusage: " + usage);
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  const std::string& sub = argv[0];
  if (sub == "train") return tokenizer_train(rest);
  if (sub == "encode") return tokenizer_encode(rest);
  if (sub == "decode") return tokenizer_decode(rest);
  if (sub == "bench") return tokenizer_bench(rest);
  if (sub == "info") return tokenizer_info(rest);
  throw core::UsageError(
      fmt::format("unknown subcommand 'tokenizer {}'{}\nusage: {}", sub,
                  core::did_you_mean(sub, {"train", "encode", "decode", "bench", "info"}), usage));
}

}  // namespace loom::cli
