// loom preprocess --input FILE|DIR... --tokenizer PATH --output PREFIX [options]
// Text (JSONL, plain text, HTML) -> a Megatron indexed dataset PREFIX.bin / PREFIX.idx.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "core/data/preprocess.h"
#include "core/util/errors.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

constexpr const char* kUsage =
    "loom preprocess --input FILE|DIR [--input ...] --tokenizer PATH --output PREFIX\n"
    "                [--append-eod] [--json-key KEY] [--txt-mode file|line|paragraph]\n"
    "                [--ext .EXT,...] [--workers N] [--skip-bad-lines] [--quiet]";

constexpr const char* kHelp = R"(
Tokenises documents into a Megatron indexed dataset (PREFIX.bin and PREFIX.idx), one
sequence per document, ids as u16 when the vocabulary has fewer than 65500 entries, else i32.

  --input FILE|DIR   .jsonl/.json (one JSON object per line), .txt/.text/.md/.rst, .html/.htm;
                     directories are walked recursively in sorted order (repeatable)
  --tokenizer PATH   tokenizer.json, vocab.json (+ merges.txt), or a directory holding them
  --output PREFIX    where to write; the directory must exist
  --append-eod       end every document with the tokenizer's end-of-document token
  --json-key KEY     the JSON field holding the text (default text)
  --txt-mode MODE    a text file is one document (file, the default), one per line (line),
                     or one per blank-line-separated paragraph (paragraph)
  --ext .A,.B        in directories, take only files with these extensions
  --workers N        tokenising threads (default: one per CPU)
  --skip-bad-lines   skip and count JSON lines that are malformed or lack the key
                     (default: stop at the first, as Megatron does)
  --quiet            no progress on stderr
)";

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    if (!item.empty()) out.push_back(item[0] == '.' ? item : "." + item);
    start = comma + 1;
  }
  return out;
}

}  // namespace

int cmd_preprocess(const std::vector<std::string>& argv) {
  for (const std::string& a : argv)
    if (a == "-h" || a == "--help") {
      std::printf("usage: %s\n%s", kUsage, kHelp);
      return core::kExitOk;
    }
  Args args = parse_args(argv, {{"--append-eod", "--skip-bad-lines", "--quiet"},
                                {"--input", "--tokenizer", "--output", "--json-key", "--txt-mode",
                                 "--ext", "--workers"},
                                0,
                                0,
                                kUsage});
  for (const char* required : {"--input", "--tokenizer", "--output"})
    if (args.all(required).empty())
      throw core::UsageError(fmt::format("{} is required\nusage: {}", required, kUsage));

  core::PreprocessOptions options;
  for (const std::string& input : args.all("--input")) options.inputs.emplace_back(input);
  options.output_prefix = args.get("--output");
  options.append_eod = args.flag("--append-eod");
  options.progress = !args.flag("--quiet");
  options.source.json_key = args.get("--json-key", "text");
  options.source.skip_bad_lines = args.flag("--skip-bad-lines");
  try {
    options.source.txt_mode = core::parse_txt_mode(args.get("--txt-mode", "file"));
  } catch (const loom::Error& e) {
    throw core::UsageError(fmt::format("--txt-mode: {}", e.what()));
  }
  for (const std::string& list : args.all("--ext"))
    for (const std::string& ext : split_commas(list)) options.source.extensions.push_back(ext);
  options.workers = static_cast<int>(args.integer("--workers", 0, 1, 1024));

  std::unique_ptr<core::Tokenizer> tokenizer = core::Tokenizer::load(args.get("--tokenizer"));
  options.tokenizer = tokenizer.get();
  if (options.progress) std::fprintf(stderr, "tokenizer: %s\n", tokenizer->describe().c_str());

  core::PreprocessStats stats;
  try {
    stats = core::preprocess(options);
  } catch (const core::IoError&) {
    throw;
  } catch (const loom::Error& e) {
    // A tokenizer without EOD for --append-eod, an input of unknown kind: the command line.
    if (e.code() == Code::kInvalidArgument) throw core::UsageError(e.what());
    throw;
  }
  std::printf("wrote %s.bin and %s.idx: %s\n", options.output_prefix.c_str(),
              options.output_prefix.c_str(), stats.summary().c_str());
  if (stats.source.bad_lines > 0)
    std::printf("first skipped line: %s\n", stats.source.first_bad_line.c_str());
  return core::kExitOk;
}

}  // namespace loom::cli
