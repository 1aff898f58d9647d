// Learning a byte-level BPE vocabulary (train_bpe in tokenizer.h), in two steps that tests and
// tools can call separately: learn_bpe (in memory) and write_gpt2_files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/data/tokenizer.h"

namespace loom::core {

/// A learnt vocabulary. Ids: 0..255 the bytes in GPT-2's order (gpt2_byte_order()), then one
/// token per merge in order, then the special tokens.
struct BpeVocabulary {
  std::vector<std::string> tokens;                  ///< by id; byte-level strings (specials raw)
  std::vector<std::pair<int32_t, int32_t>> merges;  ///< in rank order: ids of the two parts
  int64_t special_begin = 0;                        ///< id of the first special token
};

/// Word counts: the GPT-2 pre-tokens of `documents` (special tokens split out first) and how
/// often each occurs. Threads over chunks of the documents; keys view into `documents`.
std::vector<std::pair<std::string_view, int64_t>> count_words(
    const std::vector<std::string_view>& documents, const std::vector<std::string>& special_tokens,
    int threads = 0);

/// Learns the merges: the most frequent pair first; ties go to the smallest pair, comparing the
/// left parts' byte-level strings and then the right parts'. Stops at options.vocab_size tokens
/// (specials included) or when no pair occurs options.min_frequency times. Throws
/// Error(kInvalidArgument) for a vocabulary size below 256 + specials or a bad special token.
BpeVocabulary learn_bpe(const std::vector<std::string_view>& documents,
                        const BpeTrainOptions& options);

/// Writes `dir/vocab.json` and `dir/merges.txt` ("#version: 0.2" then "left right" lines),
/// each atomically; creates `dir`.
void write_gpt2_files(const BpeVocabulary& vocab, const std::filesystem::path& dir);

}  // namespace loom::core
