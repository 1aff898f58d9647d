// The trainer's data source from the spec's /data section, in two steps around the model:
// plan_data prepares what needs no model (a raw corpus tokenised and cached, the tokenizer
// found, dataset paths read), so that data errors come before anything is built; then
// make_data opens the source with the vocabulary it checks ids against (/data/vocab_size,
// or the model's).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/data/data_source.h"

namespace loom::core {

/// What /data asks for, prepared.
struct DataPlan {
  nlohmann::json node;  ///< the resolved /data section
  /// Indexed datasets (/data/paths, or the prepared /data/corpus): prefixes and blend weights.
  std::vector<std::filesystem::path> prefixes;
  std::vector<double> weights;
  std::optional<std::filesystem::path> tokenizer;  ///< what the data was written with
  int64_t tokenizer_vocab = 0;                     ///< its ids (0: no tokenizer)
  std::optional<int32_t> eod;                      ///< end-of-document id
  int64_t vocab_size = 0;  ///< /data/vocab_size, or 0: the model's vocabulary
};

/// The shape of the batches the run reads.
struct DataShape {
  int64_t micro_batch = 1, seq_length = 1;
  uint64_t seed = 0;
  int64_t train_samples = 0;  ///< steps x global batch
  int64_t valid_samples = 0;  ///< eval steps x micro batch
};

/// Prepares /data (see above). Throws SpecError / IoError naming the option or file at fault.
DataPlan plan_data(const nlohmann::json& data);

/// Opens the source `plan` describes: mock tokens, a token file or indexed datasets, with
/// ids below `plan.vocab_size` or, when that is 0, `model_vocab`. Throws SpecError naming
/// /data/vocab_size when neither is known or a tokenizer's ids do not fit an explicit one.
std::unique_ptr<DataSource> make_data(const DataPlan& plan, const DataShape& shape,
                                      int64_t model_vocab);

}  // namespace loom::core
