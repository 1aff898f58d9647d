// GPT samples over an indexed dataset, with Megatron's document, sample and shuffle indices.
//
// As Megatron-Core's GPTDataset, everything here counts the indexed dataset's sequences,
// not its documents: a document written with --split-sentences is several sequences, and a
// document with no sequence (an empty text) is nothing. A split of the dataset is the
// sequences [begin, end). They are repeated for as many epochs as `num_samples` samples of
// seq_length + 1 tokens need; the sequences of those epochs are shuffled (numpy
// RandomState(seed), the last epoch apart when it is used for less than 80% of a full one)
// into the "document index", laid end to end, and cut into samples that cross sequence
// boundaries, each overlapping the next by one token (its last token is the next sample's
// first: the label of position T-1). The samples are then shuffled. Every step follows
// Megatron-Core's GPTDataset, so for the same data, split, seed and sizes the indices equal
// Megatron's and the same samples come out in the same order.
//
// The three indices are cached on disk as .npy files (numpy.load reads them), named by a
// hash of everything they depend on; a cache that is missing, damaged or stale is rebuilt.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/data/indexed_dataset.h"

namespace loom::core {

struct GptIndexConfig {
  int64_t seq_length = 1024;        ///< T: a sample is T + 1 tokens
  uint32_t seed = 1234;             ///< numpy RandomState seed (Megatron's --seed)
  std::filesystem::path cache_dir;  ///< where the .npy indices go; empty: not cached
};

class GptDataset {
 public:
  /// \param data         the indexed dataset (shared by every split and blend using it)
  /// \param begin, end   the split's sequences [begin, end); not empty
  /// \param num_samples  samples wanted (>= 1); more may exist (the last epoch is whole)
  /// \param split        "train", "valid" or "test" (in cache names and messages)
  GptDataset(std::shared_ptr<const IndexedDataset> data, int64_t begin, int64_t end,
             int64_t num_samples, const std::string& split, const GptIndexConfig& config);

  /// Samples available (Megatron's len(): sample_index rows - 1), >= num_samples.
  int64_t size() const { return static_cast<int64_t>(sample_index_.size() / 2) - 1; }
  /// Copies the seq_length + 1 tokens of sample `index` (in [0, size())) into `out`.
  void sample(int64_t index, int32_t* out) const;

  int64_t epochs() const { return epochs_; }
  bool from_cache() const { return from_cache_; }
  /// "<cache_dir>/<hash>-GPTDataset-<split>", the stem of the cache files.
  const std::filesystem::path& cache_stem() const { return cache_stem_; }
  /// Megatron's document_index: the split's sequence ids, shuffled per epoch.
  const std::vector<int32_t>& document_index() const { return document_index_; }
  /// Flattened (size() + 1, 2): document_index position, token offset in that sequence.
  const std::vector<int64_t>& sample_index() const { return sample_index_; }
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }

 private:
  void build(int64_t tokens_per_epoch);
  bool load_cache();
  void save_cache() const;

  std::shared_ptr<const IndexedDataset> data_;
  int64_t begin_, end_, num_samples_;
  std::string split_;
  GptIndexConfig config_;
  int64_t epochs_ = 0;
  bool separate_final_epoch_ = false;
  bool from_cache_ = false;
  std::string description_;
  std::filesystem::path cache_stem_;
  std::vector<int32_t> document_index_;
  std::vector<int64_t> sample_index_;
  std::vector<int64_t> shuffle_index_;
};

/// Megatron-Core's split of a dataset's `elements` (for GPT its sequences) by weights
/// ("949,50,1" normalised): split i is [round(c_i * elements), round(c_{i+1} * elements))
/// where c_i is the sum of the weights before i (Python's round: half to even). Returns the
/// train, valid and test boundaries [0, a, b, elements].
std::vector<int64_t> split_boundaries(const std::vector<double>& weights, int64_t elements);

/// Parses "949,50,1" (one to three non-negative numbers, not all zero) into three weights
/// summing to 1. Throws SpecError at `pointer` when malformed.
std::vector<double> parse_split(const std::string& split, const std::string& pointer);

/// Megatron's blending: for sample i, the dataset whose share falls furthest behind its
/// weight (weights[d] * max(i, 1) - taken[d], the first on ties). Returns, for each of `size`
/// samples, the dataset and the index of the sample within it.
void blending_indices(const std::vector<double>& weights, int64_t size,
                      std::vector<int16_t>& dataset, std::vector<int64_t>& dataset_sample);

}  // namespace loom::core
