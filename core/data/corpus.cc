#include "core/data/corpus.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "core/data/indexed_dataset.h"
#include "core/data/preprocess.h"
#include "core/data/text_source.h"
#include "core/data/tokenizer.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/hash.h"
#include "core/util/log.h"

namespace loom::core {

namespace fs = std::filesystem;

namespace {

fs::path default_cache_root() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return fs::path(xdg) / "loom" / "corpora";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return fs::path(home) / ".cache" / "loom" / "corpora";
  return fs::temp_directory_path() / "loom-corpora";
}

// True when `file` (found under `root`) matches one of the exclusion patterns, either by its
// file name or by its path relative to the input directory.
bool excluded(const fs::path& file, const std::vector<fs::path>& roots,
              const std::vector<std::string>& patterns) {
  std::string name = file.filename().string();
  for (const std::string& p : patterns) {
    if (wildcard_match(p, name)) return true;
    for (const fs::path& root : roots) {
      fs::path rel = file.lexically_relative(root);
      if (!rel.empty() && rel.native()[0] != '.' && wildcard_match(p, rel.generic_string()))
        return true;
    }
  }
  return false;
}

bool usable(const fs::path& dir, bool own_tokenizer) {
  std::error_code ec;
  if (!fs::exists(dir / "corpus.idx", ec) || !fs::exists(dir / "corpus.bin", ec)) return false;
  if (own_tokenizer && !fs::exists(dir / "tokenizer" / "vocab.json", ec)) return false;
  try {
    IndexedDataset check(dir / "corpus");
    return check.documents() > 0;
  } catch (const std::exception& e) {
    log_warning("data", fmt::format("rebuilding the cached corpus: {}", e.what()));
    return false;
  }
}

}  // namespace

bool wildcard_match(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0, star = std::string_view::npos, back = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      back = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++back;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

PreparedCorpus prepare_corpus(const nlohmann::json& corpus, const std::string& pointer,
                              const std::optional<fs::path>& tokenizer) {
  TextSourceOptions source;
  source.json_key = corpus.value("json_key", "text");
  std::vector<fs::path> inputs;
  const nlohmann::json& list = corpus["inputs"];
  for (size_t i = 0; i < list.size(); ++i) {
    fs::path input = list[i].get<std::string>();
    std::error_code ec;
    if (!fs::exists(input, ec)) {
      std::string hint = input.string().rfind("/usr/share/doc/python3", 0) == 0
                             ? "; Debian's python3-doc package provides it (run tools/setup)"
                             : "";
      throw IoError(fmt::format("{}: no such file or directory (spec {}/inputs/{}){}",
                                input.string(), pointer, i, hint));
    }
    inputs.push_back(input);
  }
  std::vector<std::string> patterns;
  for (const auto& p : corpus.value("exclude", nlohmann::json::array()))
    patterns.push_back(p.get<std::string>());
  std::vector<fs::path> files;
  for (const fs::path& f : list_input_files(inputs, source))
    if (!excluded(f, inputs, patterns)) files.push_back(f);
  if (files.empty())
    throw IoError(fmt::format("spec {}/inputs: every input file is excluded by {}/exclude", pointer,
                              pointer));
  // Documents go into the dataset in an order fixed by a hash of their names, not in path
  // order, so that the last documents (the valid and test splits) are a sample of the whole
  // corpus rather than its alphabetical tail (for the Python docs: the "what's new" pages).
  std::stable_sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return fnv1a64(a.filename().string() + a.parent_path().filename().string()) <
           fnv1a64(b.filename().string() + b.parent_path().filename().string());
  });

  // The cache key: every file's path, size and modification time, and the options.
  int64_t vocab_size = corpus.value("vocab_size", 8192);
  nlohmann::json key = {{"format", 1},
                        {"json_key", source.json_key},
                        {"vocab_size", tokenizer ? 0 : vocab_size},
                        {"tokenizer", tokenizer ? fs::absolute(*tokenizer).string() : ""}};
  int64_t total_bytes = 0;
  for (const fs::path& f : files) {
    std::error_code ec;
    auto size = static_cast<int64_t>(fs::file_size(f, ec));
    auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    key["files"].push_back({fs::absolute(f).string(), size, mtime});
    total_bytes += size;
  }
  fs::path root = corpus.contains("cache_dir") ? fs::path(corpus["cache_dir"].get<std::string>())
                                               : default_cache_root();
  std::string stem = fs::absolute(inputs[0]).lexically_normal().filename().string();
  if (stem.empty()) stem = "corpus";
  fs::path dir = root / fmt::format("{}-{:016x}", stem, fnv1a64(key.dump()));
  PreparedCorpus out{dir / "corpus", tokenizer ? *tokenizer : dir / "tokenizer", false};
  if (usable(dir, !tokenizer)) {
    out.reused = true;
    return out;
  }

  auto start = std::chrono::steady_clock::now();
  log_info("data", fmt::format("preparing the corpus in {} (first use; later runs reuse it): {} "
                               "files, {:.1f} MB",
                               dir.string(), files.size(), total_bytes / 1e6));
  fs::path tmp = root / fmt::format(".{}.tmp.{}", dir.filename().string(), ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec)
    throw IoError(fmt::format("{}: cannot create the corpus cache ({}); set {}/cache_dir",
                              tmp.string(), ec.message(), pointer));
  try {
    if (!tokenizer) {
      std::vector<std::string> texts;
      TextSourceStats read = for_each_document(
          files, source,
          [&](std::string_view text, const DocumentOrigin&) { texts.emplace_back(text); });
      std::vector<std::string_view> views(texts.begin(), texts.end());
      int64_t text_bytes = 0;
      for (const auto& t : texts) text_bytes += static_cast<int64_t>(t.size());
      log_info("data", fmt::format("training a byte-level BPE tokenizer of {} tokens on {} "
                                   "documents ({:.1f} MB of text)",
                                   vocab_size, read.documents, text_bytes / 1e6));
      BpeTrainOptions train;
      train.vocab_size = vocab_size;
      train.progress = ::isatty(2) != 0;
      train_bpe(views, train, tmp / "tokenizer");
    }
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(tokenizer ? *tokenizer : tmp / "tokenizer");
    PreprocessOptions pre;
    pre.inputs = files;
    pre.source = source;
    pre.tokenizer = tok.get();
    pre.output_prefix = tmp / "corpus";
    pre.append_eod = true;
    pre.progress = ::isatty(2) != 0;
    PreprocessStats stats = preprocess(pre);
    log_info("data", "tokenised: " + stats.summary());
    nlohmann::json about = {{"key", key}, {"summary", stats.summary()}};
    write_file_atomic(tmp / "corpus.json", about.dump(2) + "\n");
    fs::rename(tmp, dir, ec);
    if (ec) {
      // Another run prepared it meanwhile: use theirs.
      fs::remove_all(tmp, ec);
      if (!usable(dir, !tokenizer))
        throw IoError(fmt::format("{}: cannot move the prepared corpus into place", dir.string()));
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("data", fmt::format("corpus ready in {:.1f} s", seconds));
  return out;
}

}  // namespace loom::core
