// Pre-tokenisation: the split of text into the pieces ("pre-tokens") that BPE encodes
// separately. Hand-written scanners that reproduce the regexes of GPT-2 and Llama-3 exactly
// as Oniguruma (the regex engine of Hugging Face `tokenizers`) matches them, without a regex
// engine: ordered alternation, greedy runs and the backtracking of `\s+(?!\S)`.
//
// Any byte string is accepted: invalid UTF-8 bytes are single characters of class "other"
// (unicode.h), so the pre-tokens always cover the input exactly.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace loom::core {

enum class PreTokenPattern {
  kGpt2,    ///< kGpt2Pattern: GPT-2, and Hugging Face's ByteLevel pre-tokeniser (use_regex)
  kLlama3,  ///< kLlama3Pattern: Llama-3 and OpenAI's cl100k
};

/// The regexes, as written in tokenizer.json files.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// The end (a byte offset) of the pre-token of `text` that starts at `pos` (< text.size()).
/// Pre-tokens are never empty.
size_t pretoken_end(PreTokenPattern pattern, std::string_view text, size_t pos);

/// All pre-tokens of `text`, in order (for tests and tools; encoding calls pretoken_end).
std::vector<std::string_view> pretokenize(PreTokenPattern pattern, std::string_view text);

}  // namespace loom::core
