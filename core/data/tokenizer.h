// Byte-level BPE tokenizer (GPT-2's scheme, also Hugging Face `tokenizers`' ByteLevel BPE).
//
// Text is first split at added/special tokens (longest match wins), then each remaining
// piece is pre-tokenised with a regex (GPT-2's by default), every byte of a pre-token is
// mapped to a printable code point (GPT-2's bytes_to_unicode table), and BPE merges are
// applied by rank. Encoding any byte string is defined: bytes that are not valid UTF-8 are
// pre-tokenised as single "other" characters, so decode(encode(s)) == s for every input.
//
// Loads GPT-2 style `vocab.json` + `merges.txt` and Hugging Face `tokenizer.json` (model
// type BPE with a ByteLevel pre-tokeniser / decoder). Used by `loom preprocess`, the
// trainer's corpus preparation, `loom tokenizer` and (later) `loom generate`.
//
// Encoding gives the ids of Hugging Face `tokenizers` 0.23.3 (encode with
// add_special_tokens=False), checked by tests/reference/tokenizer_hf_test; the character
// classes of the pre-tokeniser regexes are those of Unicode 16.0, as in the Oniguruma inside
// `tokenizers` (tools/unicode/gen_unicode_tables.py). Implementation: tokenizer_bpe.h (the
// pipeline), pretokenize.h (the regexes), bpe.h (merges), bpe_trainer.h (training).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::core {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Loads a tokenizer from `path`:
  ///  - a directory holding `tokenizer.json`, or `vocab.json` + `merges.txt`;
  ///  - a `tokenizer.json` file;
  ///  - a `vocab.json` file (its sibling `merges.txt` is read too; for Megatron's
  ///    `gpt2-vocab.json`, `gpt2-merges.txt`).
  /// GPT-2 files list no special tokens: a vocabulary entry that is neither a byte nor the
  /// result of a merge (GPT-2's `<|endoftext|>`, the special tokens of train_bpe) is taken as
  /// one. tokenizer.json: ByteLevel, or Sequence[Split(GPT-2 or Llama-3 regex), ByteLevel],
  /// pre-tokenisation; no normalizer; added tokens with lstrip/rstrip (not single_word);
  /// ignore_merges; dropout, continuing_subword_prefix and end_of_word_suffix are refused.
  /// Throws IoError naming the file and what is wrong (missing, not JSON, an unsupported
  /// model or pre-tokeniser, a merge whose parts are not in the vocabulary, a byte without a
  /// token, ...).
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& path);

  /// Token ids of `text` (any bytes; see the header comment). Added/special tokens in the
  /// text are recognised (as Hugging Face `tokenizers` does by default).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  /// Appends the ids of `text` to `out` (the fast path of preprocess: no allocation per call
  /// once warm). Thread-safe: one Tokenizer may be shared by many threads.
  virtual void encode_into(std::string_view text, std::vector<int32_t>& out) const = 0;
  /// The bytes `ids` stand for: byte-level tokens map back through GPT-2's byte table, added
  /// tokens give their content (so decode(encode(s)) == s; `tokenizers` would pass an added
  /// token's non-ASCII characters through the byte table, and replaces bytes that are not
  /// UTF-8). Throws Error(kInvalidArgument) on an id outside the vocabulary or in a gap.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

  /// Number of ids (the largest id + 1, counting added tokens).
  virtual int64_t vocab_size() const = 0;
  /// End-of-document id: `<|endoftext|>` when present, else the eos token that a
  /// tokenizer_config.json beside the files names, else `<|end_of_text|>` (Llama-3) or `</s>`;
  /// std::nullopt when there is none of these.
  virtual std::optional<int32_t> eod() const = 0;
  /// The id of a token string as it appears in the vocabulary (byte-level form), if any.
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  /// The vocabulary string of `id` (byte-level form); empty when out of range.
  virtual std::string id_to_token(int32_t id) const = 0;
  /// One line for banners: "byte-level BPE, 8192 tokens (vocab.json + merges.txt)".
  virtual std::string describe() const = 0;
};

/// Options of `train_bpe`.
struct BpeTrainOptions {
  int64_t vocab_size = 8192;  ///< total ids, including the 256 bytes and special tokens
  int64_t min_frequency = 2;  ///< pairs seen fewer times are never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};  ///< appended after merges
  bool progress = false;                                        ///< a progress line on stderr
};

/// Learns a byte-level BPE vocabulary from `documents` (GPT-2 pre-tokenisation) and writes
/// `dir/vocab.json` and `dir/merges.txt` in GPT-2's format (readable by Hugging Face
/// `tokenizers`, `transformers` and Tokenizer::load). Deterministic: ties between equally
/// frequent pairs go to the lexicographically smallest pair. Writes atomically.
void train_bpe(const std::vector<std::string_view>& documents, const BpeTrainOptions& options,
               const std::filesystem::path& dir);

}  // namespace loom::core
