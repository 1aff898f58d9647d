// The byte-level BPE tokenizer behind Tokenizer::load: its configuration (what the files say,
// already checked for what loom supports) and the factory. Tokenizer::load fills the
// configuration from vocab.json + merges.txt or tokenizer.json; tests may build one directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/data/pretokenize.h"
#include "core/data/tokenizer.h"

namespace loom::core {

/// A token matched in the text before pre-tokenisation (Hugging Face's AddedToken).
struct AddedToken {
  std::string content;  ///< matched as raw bytes; decodes to itself
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;     ///< swallows the white space before it
  bool rstrip = false;     ///< swallows the white space after it
  bool normalized = true;  ///< matched in the second pass (Hugging Face's normalized tokens)
};

struct ByteLevelBpeConfig {
  /// Vocabulary strings (byte-level form) and their ids; ids may have holes.
  std::vector<std::pair<std::string, int32_t>> vocab;
  /// Merges in rank order, as vocabulary strings.
  std::vector<std::pair<std::string, std::string>> merges;
  /// Where merge k was read (a line number of merges.txt, an index in tokenizer.json); may be
  /// empty. For messages.
  std::vector<int64_t> merge_lines;
  std::vector<AddedToken> added_tokens;

  /// A Split pre-tokeniser before the byte-level step (tokenizer.json's Sequence[Split, ...]).
  std::optional<PreTokenPattern> split;
  /// The byte-level step: prepend ' ' to each piece that does not start with one, then split
  /// it with the GPT-2 pattern when `byte_level_regex`.
  bool add_prefix_space = false;
  bool byte_level_regex = true;
  /// Llama-3: a pre-token that is itself in the vocabulary is one token, merges or not.
  bool ignore_merges = false;

  std::string vocab_source;   ///< the file the vocabulary came from (messages)
  std::string merges_source;  ///< the file the merges came from (messages)
  std::string description;    ///< Tokenizer::describe()
  /// The eos token named beside the files (tokenizer_config.json), if any.
  std::optional<std::string> eos_token;
};

/// Builds the tokenizer. Throws IoError naming the sources when the vocabulary and merges do
/// not fit together (a merge naming an unknown token, two tokens with one id, a byte without
/// a token, ...).
std::unique_ptr<Tokenizer> make_byte_level_bpe(ByteLevelBpeConfig config);

}  // namespace loom::core
