// Megatron's IndexedDataset (.bin/.idx, "MMIDIDX"), byte for byte.
//
// PREFIX.idx, little-endian, packed with no padding:
//   char[9]   magic "MMIDIDX\0\0"
//   uint64    version = 1
//   uint8     dtype code: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16
//   uint64    S, the sequence count
//   uint64    D, the document-index count (documents + 1)
//   int32[S]  sequence lengths (tokens)
//   int64[S]  sequence pointers (byte offsets into PREFIX.bin)
//   int64[D]  document indices: 0, ..., S (document d is sequences [doc[d], doc[d+1]))
// PREFIX.bin: the tokens of every sequence, back to back, in the dtype above.
//
// `loom preprocess` writes one sequence per document (EOD appended when asked), and a
// document whose text has no tokens as a document with no sequence (equal consecutive
// document indices), as Megatron's preprocess_data.py does without sentence splitting. The
// writer also takes several sequences per document (what --split-sentences writes); the
// reader accepts all of that and multimodal indices (a trailing int8[S] of sequence modes,
// which loom ignores). GPT samples are built over sequences, not documents (gpt_dataset.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace loom::core {

/// Megatron's dtype codes.
enum class IndexedDType : uint8_t {
  kU8 = 1,
  kI8 = 2,
  kI16 = 3,
  kI32 = 4,
  kI64 = 5,
  kF64 = 6,
  kF32 = 7,
  kU16 = 8
};

/// Bytes per element of `dtype`.
int64_t indexed_dtype_size(IndexedDType dtype);
/// "u16", "i32", ... for messages.
const char* indexed_dtype_name(IndexedDType dtype);
/// Megatron's choice: u16 when the vocabulary has fewer than 65500 entries, else i32.
IndexedDType indexed_dtype_for_vocab(int64_t vocab_size);

/// Read side: the header and every invariant checked on open. PREFIX.bin stays
/// memory-mapped; the index arrays are copied into memory (20 bytes a sequence), because in
/// the file they sit at unaligned offsets (the header is 34 bytes).
class IndexedDataset {
 public:
  /// Opens PREFIX.idx and PREFIX.bin. Throws IoError naming the file and exactly what is
  /// wrong (missing, bad magic/version/dtype code, a float dtype, truncated arrays, lengths
  /// and pointers that disagree, document indices not rising from 0 to S, .bin size not
  /// matching).
  explicit IndexedDataset(const std::filesystem::path& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::filesystem::path& prefix() const { return prefix_; }
  IndexedDType dtype() const { return dtype_; }
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  /// Number of documents (D - 1).
  int64_t documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  /// Total tokens in .bin.
  int64_t tokens() const { return tokens_; }
  std::span<const int32_t> sequence_lengths() const { return lengths_; }
  std::span<const int64_t> sequence_pointers() const { return pointers_; }
  std::span<const int64_t> document_indices() const { return doc_index_; }

  /// Copies tokens [offset, offset + count) of sequence `sequence` into `out`, converted to
  /// int32. Bounds are checked (InvalidArgument). Thread-safe.
  void read(int64_t sequence, int64_t offset, int64_t count, int32_t* out) const;
  /// All tokens of sequence `sequence`, as int32.
  std::vector<int32_t> sequence(int64_t sequence) const;

 private:
  std::filesystem::path prefix_;
  IndexedDType dtype_ = IndexedDType::kU16;
  const unsigned char* bin_ = nullptr;  // nullptr when PREFIX.bin is empty
  size_t bin_size_ = 0;
  int64_t tokens_ = 0;
  std::vector<int32_t> lengths_;    // (S,)
  std::vector<int64_t> pointers_;   // (S,) byte offsets
  std::vector<int64_t> doc_index_;  // (D,)
};

/// Write side: streams PREFIX.bin while it collects the index, and writes PREFIX.idx on
/// finish(). Both files are written under temporary names and renamed into place only by
/// finish(), so a crash never leaves a half-written dataset behind the final names.
class IndexedDatasetWriter {
 public:
  /// \param prefix  output prefix (PREFIX.bin / PREFIX.idx); its directory must exist
  /// \param dtype   token dtype (indexed_dtype_for_vocab for token ids)
  IndexedDatasetWriter(const std::filesystem::path& prefix, IndexedDType dtype);
  /// Removes the temporary files when finish() was not reached.
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  /// Appends one document made of one sequence; empty `tokens` append a document with no
  /// sequence (as Megatron's preprocess_data.py writes a text without tokens). Ids must fit
  /// the dtype (InvalidArgument naming the id and the dtype otherwise; nothing is written
  /// then).
  void add_document(std::span<const int32_t> tokens);
  /// Appends one document made of sequences of `sequence_lengths` tokens (Megatron's
  /// add_document(tokens, lengths)); the lengths must be >= 0 and sum to tokens.size()
  /// (InvalidArgument otherwise). No lengths: a document with no sequence.
  void add_document(std::span<const int32_t> tokens, std::span<const int32_t> sequence_lengths);
  /// Writes the index, fsyncs, and renames both files into place. Call once.
  void finish();

  int64_t documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }
  /// Bytes of PREFIX.bin so far.
  int64_t bin_bytes() const { return tokens_ * indexed_dtype_size(dtype_); }

 private:
  std::filesystem::path prefix_, bin_tmp_, idx_tmp_;
  IndexedDType dtype_;
  int fd_ = -1;
  std::vector<int32_t> lengths_;         // (S,)
  std::vector<int64_t> doc_index_ = {0};  // (D,)
  std::vector<unsigned char> buffer_;  // pending .bin bytes, flushed at kFlushBytes
  int64_t tokens_ = 0;
  bool finished_ = false;

  void flush();
};

}  // namespace loom::core
