// Raw text that loom turns into a training set on first use (spec /data/corpus): the files
// are read (text_source.h), a byte-level BPE tokenizer is trained on them unless one is
// given, and the documents are tokenised into an indexed dataset (preprocess.h). Both are
// cached in a directory named by a hash of the inputs (paths, sizes, modification times)
// and the options, so the next run starts at once; a change to any input rebuilds.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace loom::core {

struct PreparedCorpus {
  std::filesystem::path prefix;     ///< the indexed dataset (PREFIX.bin / PREFIX.idx)
  std::filesystem::path tokenizer;  ///< the tokenizer it was written with
  bool reused = false;              ///< found in the cache
};

/// Prepares (or finds in the cache) the corpus that spec `corpus` (the /data/corpus object,
/// defaults filled in) describes. `tokenizer`: use this one instead of training one.
/// Throws SpecError at `pointer` or IoError naming the file at fault.
PreparedCorpus prepare_corpus(const nlohmann::json& corpus, const std::string& pointer,
                              const std::optional<std::filesystem::path>& tokenizer);

/// True when `name` matches the shell-style `pattern` (* and ?; no character classes).
bool wildcard_match(std::string_view pattern, std::string_view name);

}  // namespace loom::core
