// The pieces of byte-level BPE shared by encoding and training: GPT-2's byte <-> code point
// table, the merge table, and the merge loop of Hugging Face `tokenizers`.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::core {

/// GPT-2's bytes_to_unicode(): the printable code point that stands for each byte in
/// vocabulary strings (' ' is U+0120 'Ġ', '\n' is U+010A 'Ċ', printable ASCII is itself).
const std::array<uint32_t, 256>& byte_to_code_point();

/// The bytes in GPT-2's order: the printable ranges '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF
/// first, then the other 68 bytes in increasing order. GPT-2's vocab.json (and loom's trained
/// vocabularies) give byte gpt2_byte_order()[i] the id i.
const std::array<uint8_t, 256>& gpt2_byte_order();

/// The vocabulary string of raw bytes ("Ġhello" for " hello").
std::string bytes_to_byte_level(std::string_view bytes);

/// The raw bytes of a vocabulary string, appended to `out`; false (and `out` unchanged) when a
/// character of `token` is not in the byte table.
bool byte_level_to_bytes(std::string_view token, std::string& out);

/// The merges of a BPE model: pair of ids -> (rank, id of the merged token). An open-addressing
/// table: lookups are the inner loop of encoding.
class BpeMerges {
 public:
  struct Merge {
    int32_t rank;
    int32_t id;
  };

  /// Adds or replaces (as Hugging Face does for a repeated pair: the later line wins).
  void insert(int32_t left, int32_t right, Merge merge);
  /// The merge of (left, right), or nullptr.
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }
  size_t slot_of(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  void grow();

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

/// Applies `merges` to the symbol ids of one pre-token, in place, as Hugging Face's BPE does:
/// repeatedly merge the pair with the lowest rank, the leftmost of its occurrences first.
/// Short words use a scan, long ones a heap (bpe_merge_scan / bpe_merge_heap give the same
/// result; both are public for the tests).
void bpe_merge(const BpeMerges& merges, std::vector<int32_t>& symbols);
void bpe_merge_scan(const BpeMerges& merges, std::vector<int32_t>& symbols);
void bpe_merge_heap(const BpeMerges& merges, std::vector<int32_t>& symbols);

}  // namespace loom::core
