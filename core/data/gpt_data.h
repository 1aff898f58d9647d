// GptData: the trainer's data source over Megatron indexed datasets (data.paths).
//
// Each prefix's sequences (not documents, as Megatron-Core's GPTDataset) are split into
// train/valid/test by data.split (Megatron-Core's rounding);
// each split becomes a GptDataset (Megatron's indices, cached on disk) and, with several
// prefixes, a blend by weight (Megatron's blending indices). Training reads sample after
// sample of the train blend, so position() is the number of samples consumed and seek()
// resumes at exactly the next one. Validation reads a fixed set of valid samples.
//
// Per sample of T + 1 tokens: tokens = [0, T), labels = [1, T]; with eod_mask_loss the loss
// ignores positions whose input token is EOD; with reset_position_ids positions restart
// after each EOD; with reset_attention_mask tokens attend only within their document
// (segment ids). These follow Megatron's _get_ltor_masks_and_position_ids.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/data/data_source.h"
#include "core/data/gpt_dataset.h"

namespace loom::core {

struct GptDataOptions {
  std::vector<std::filesystem::path> prefixes;  ///< dataset prefixes (PREFIX.bin / PREFIX.idx)
  std::vector<double> weights;                  ///< blend weights (one per prefix), or empty
  std::string split = "949,50,1";               ///< train,valid,test sequence weights
  int64_t batch = 1;                            ///< B
  int64_t seq_length = 1024;                    ///< T
  uint32_t seed = 1234;
  int64_t train_samples = 0;  ///< samples the run reads (steps x global batch)
  int64_t valid_samples = 0;  ///< size of the fixed validation set (eval steps x B)
  /// Where the indices are cached; empty: "<first prefix's dir>/cache/GPTDataset_indices".
  std::filesystem::path cache_dir;
  int64_t vocab_size = 0;      ///< ids must be below it (checked as samples are read)
  std::optional<int32_t> eod;  ///< end-of-document id (needed by the three options below)
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  std::string spec_pointer = "/data";  ///< where these options came from, for messages
};

/// Megatron's --data-path list: prefixes ["a", "b"] (equal weights) or weight/prefix pairs
/// [0.7, "a", 0.3, "b"] (weights as numbers or numeric strings). Throws SpecError at
/// `pointer` for anything else.
void parse_data_paths(const nlohmann::json& paths, const std::string& pointer,
                      std::vector<std::filesystem::path>& prefixes, std::vector<double>& weights);

class GptData final : public DataSource {
 public:
  /// Opens every prefix and builds (or loads) the indices. Throws SpecError / IoError naming
  /// the option or file at fault.
  explicit GptData(const GptDataOptions& options);
  ~GptData() override;

  void next_train(Batch& out) override;
  bool valid_batch(int64_t index, Batch& out) override;
  int64_t position() const override { return position_; }
  void seek(int64_t position) override { position_ = position; }
  std::string describe() const override;

  /// Entropy (nats/token) of the train split's unigram distribution (blend-weighted): the
  /// loss of a model that knows token frequencies but no context.
  double unigram_entropy() const { return unigram_entropy_; }
  /// The fixed-length token window of train sample `index` (T + 1 tokens), for tests.
  void train_sample(int64_t index, int32_t* out) const;

  struct Split;

 private:
  void fill(const Split& split, int64_t sample, int64_t row, Batch& out) const;
  GptDataOptions options_;
  std::vector<std::shared_ptr<const IndexedDataset>> datasets_;
  std::vector<double> split_weights_;
  std::unique_ptr<Split> train_, valid_;
  double unigram_entropy_ = 0;
  int64_t position_ = 0;
  mutable std::vector<int32_t> window_;
};

}  // namespace loom::core
