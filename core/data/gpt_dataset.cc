#include "core/data/gpt_dataset.h"

#include <fmt/format.h>

#include <cfenv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "core/data/npy_file.h"
#include "core/data/numpy_random.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/hash.h"
#include "core/util/log.h"

namespace loom::core {

namespace fs = std::filesystem;

namespace {

// Megatron's _build_document_index: the split's sequences tiled over `epochs` and shuffled.
void append_shuffled_epochs(int64_t begin, int64_t end, int64_t epochs, NumpyRandomState& rng,
                            std::vector<int32_t>& out) {
  size_t at = out.size();
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t d = begin; d < end; ++d) out.push_back(static_cast<int32_t>(d));
  rng.shuffle(std::span<int32_t>(out.data() + at, out.size() - at));
}

// Megatron's _build_shuffle_index: [0, first) and [first, total) shuffled separately, in
// the dtype Megatron uses (uint32 below 2^32 - 1 samples, so the draws are the same).
void shuffled_range(int64_t from, int64_t to, NumpyRandomState& rng, std::vector<int64_t>& out) {
  size_t at = out.size();
  for (int64_t i = from; i < to; ++i) out.push_back(i);
  rng.shuffle(std::span<int64_t>(out.data() + at, out.size() - at));
}

}  // namespace

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, int64_t begin, int64_t end,
                       int64_t num_samples, const std::string& split, const GptIndexConfig& config)
    : data_(std::move(data)),
      begin_(begin),
      end_(end),
      num_samples_(num_samples),
      split_(split),
      config_(config) {
  if (begin_ < 0 || end_ > data_->sequences() || begin_ >= end_)
    throw InvalidArgument(fmt::format("{}: {} split has no sequences ([{}, {}) of {})",
                                      data_->prefix().string(), split_, begin_, end_,
                                      data_->sequences()));
  if (num_samples_ < 1 || config_.seq_length < 1)
    throw InvalidArgument(fmt::format("{}: {} split: {} samples of seq_length {} requested",
                                      data_->prefix().string(), split_, num_samples_,
                                      config_.seq_length));
  const auto lengths = data_->sequence_lengths();
  int64_t tokens_per_epoch = 0;
  for (int64_t s = begin_; s < end_; ++s) tokens_per_epoch += lengths[s];
  if (tokens_per_epoch < 2)
    throw IoError(
        fmt::format("{}: the {} split (sequences {}..{}) holds {} tokens; a sample "
                    "needs at least 2",
                    data_->prefix().string(), split_, begin_, end_ - 1, tokens_per_epoch));
  const int64_t t = config_.seq_length;
  // Megatron's _get_num_epochs: enough epochs for num_samples * T + 1 tokens.
  epochs_ = 1;
  while (epochs_ * tokens_per_epoch < num_samples_ * t + 1) ++epochs_;
  if (epochs_ > 1) {
    int64_t sans_final = ((epochs_ - 1) * tokens_per_epoch - 1) / t;
    int64_t from_final = num_samples_ - sans_final;
    int64_t per_epoch = (tokens_per_epoch - 1) / t;
    separate_final_epoch_ = from_final < static_cast<int64_t>(0.8 * static_cast<double>(per_epoch));
  }

  nlohmann::json description = {
      {"class", "GPTDataset"},
      {"format", 2},  // 2: over sequences (1 went over documents)
      {"dataset", fs::absolute(data_->prefix()).lexically_normal().string()},
      {"dataset_sequences", data_->sequences()},
      {"dataset_tokens", data_->tokens()},
      {"sequences", {begin_, end_}},
      {"split", split_},
      {"num_samples", num_samples_},
      {"seq_length", t},
      {"add_extra_token", true},
      {"random_seed", config_.seed},
  };
  description_ = description.dump(2);
  if (!config_.cache_dir.empty())
    cache_stem_ =
        config_.cache_dir / fmt::format("{:016x}-GPTDataset-{}", fnv1a64(description_), split_);
  if (!cache_stem_.empty() && load_cache()) {
    from_cache_ = true;
    return;
  }
  build(tokens_per_epoch);
  if (!cache_stem_.empty()) save_cache();
}

void GptDataset::build(int64_t tokens_per_epoch) {
  const int64_t t = config_.seq_length;
  NumpyRandomState rng(config_.seed);
  // Document index.
  document_index_.clear();
  document_index_.reserve(static_cast<size_t>(epochs_ * (end_ - begin_)));
  if (!separate_final_epoch_) {
    append_shuffled_epochs(begin_, end_, epochs_, rng, document_index_);
  } else {
    append_shuffled_epochs(begin_, end_, epochs_ - 1, rng, document_index_);
    append_shuffled_epochs(begin_, end_, 1, rng, document_index_);
  }
  // Sample index (Megatron's build_sample_idx, dropping the last partial sample): rows of
  // (position in document_index, offset in that sequence) where each sample starts; sample
  // i ends where sample i + 1 starts, inclusive (the extra token).
  int64_t samples = (epochs_ * tokens_per_epoch - 1) / t;
  sample_index_.assign(static_cast<size_t>(2 * (samples + 1)), 0);
  // Walks the sequence lengths, as Megatron's helpers build_sample_idx does.
  const auto lengths = data_->sequence_lengths();
  int64_t doc_pos = 0, offset = 0;
  const int64_t last = static_cast<int64_t>(document_index_.size()) - 1;
  for (int64_t s = 1; s <= samples; ++s) {
    int64_t remaining = t + 1;
    while (remaining != 0) {
      int64_t doc_len = lengths[document_index_[doc_pos]] - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - 1;
        remaining = 0;
      } else {
        if (doc_pos == last) {
          offset = lengths[document_index_[doc_pos]] - 1;
          break;
        }
        ++doc_pos;
        offset = 0;
      }
    }
    sample_index_[2 * s] = doc_pos;
    sample_index_[2 * s + 1] = offset;
  }
  // Shuffle index: the samples before the final epoch apart from those of it.
  int64_t first = separate_final_epoch_ ? ((epochs_ - 1) * tokens_per_epoch - 1) / t : samples;
  shuffle_index_.clear();
  shuffle_index_.reserve(static_cast<size_t>(samples));
  shuffled_range(0, first, rng, shuffle_index_);
  if (first < samples) shuffled_range(first, samples, rng, shuffle_index_);
}

bool GptDataset::load_cache() {
  std::string why;
  fs::path stem = cache_stem_;
  auto doc = read_npy(fs::path(stem.string() + "-document_index.npy"), &why);
  auto smp = doc ? read_npy(fs::path(stem.string() + "-sample_index.npy"), &why) : std::nullopt;
  auto shf = smp ? read_npy(fs::path(stem.string() + "-shuffle_index.npy"), &why) : std::nullopt;
  if (!shf) {
    if (why.find(": missing") == std::string::npos)
      log_warning("data", fmt::format("rebuilding dataset indices: {}", why));
    return false;
  }
  int64_t docs = epochs_ * (end_ - begin_);
  bool ok = doc->shape == std::vector<int64_t>{docs} && smp->shape.size() == 2 &&
            smp->shape[1] == 2 && smp->shape[0] >= 2 &&
            shf->shape == std::vector<int64_t>{smp->shape[0] - 1};
  for (int64_t v : doc->values) ok = ok && v >= begin_ && v < end_;
  for (size_t i = 0; ok && i < smp->values.size(); i += 2)
    ok = smp->values[i] >= 0 && smp->values[i] < docs && smp->values[i + 1] >= 0;
  for (int64_t v : shf->values) ok = ok && v >= 0 && v < smp->shape[0] - 1;
  if (!ok) {
    log_warning("data", fmt::format("rebuilding dataset indices: {}-*.npy do not fit the dataset",
                                    stem.string()));
    return false;
  }
  document_index_.assign(doc->values.begin(), doc->values.end());
  sample_index_ = std::move(smp->values);
  shuffle_index_ = std::move(shf->values);
  return true;
}

void GptDataset::save_cache() const {
  try {
    fs::create_directories(config_.cache_dir);
    std::string stem = cache_stem_.string();
    write_file_atomic(stem + "-description.txt", description_ + "\n");
    std::vector<int64_t> doc(document_index_.begin(), document_index_.end());
    write_npy(stem + "-document_index.npy", "<i4", {static_cast<int64_t>(doc.size())}, doc);
    int64_t rows = static_cast<int64_t>(sample_index_.size() / 2);
    bool wide = sample_index_[sample_index_.size() - 2] > INT32_MAX;
    write_npy(stem + "-sample_index.npy", wide ? "<i8" : "<i4", {rows, 2}, sample_index_);
    int64_t n = static_cast<int64_t>(shuffle_index_.size());
    write_npy(stem + "-shuffle_index.npy", n < UINT32_MAX ? "<u4" : "<i8", {n}, shuffle_index_);
  } catch (const std::exception& e) {
    log_warning("data", fmt::format("dataset indices not cached ({}); they are rebuilt next run",
                                    e.what()));
  }
}

void GptDataset::sample(int64_t index, int32_t* out) const {
  if (index < 0 || index >= size())
    throw InvalidArgument(fmt::format("{}: {} sample {} outside [0, {})", data_->prefix().string(),
                                      split_, index, size()));
  int64_t i = shuffle_index_[index];
  int64_t beg = sample_index_[2 * i], beg_off = sample_index_[2 * i + 1];
  int64_t end = sample_index_[2 * i + 2], end_off = sample_index_[2 * i + 3];
  // As Megatron's GPTDataset: the sequences at document_index positions beg..end.
  if (beg == end) {
    data_->read(document_index_[beg], beg_off, end_off - beg_off + 1, out);
    return;
  }
  const auto lengths = data_->sequence_lengths();
  for (int64_t p = beg; p <= end; ++p) {
    int64_t seq = document_index_[p];
    int64_t offset = p == beg ? beg_off : 0;
    int64_t count = p < end ? lengths[seq] - offset : end_off + 1;
    data_->read(seq, offset, count, out);
    out += count;
  }
}

std::vector<double> parse_split(const std::string& split, const std::string& pointer) {
  std::vector<double> w;
  std::stringstream list(split);
  std::string item;
  while (std::getline(list, item, ',')) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || !(v >= 0) || !std::isfinite(v))
      throw SpecError(pointer, fmt::format("'{}' is not a list of up to three non-negative "
                                           "weights like \"949,50,1\"",
                                           split));
    w.push_back(v);
  }
  if (w.empty() || w.size() > 3)
    throw SpecError(pointer,
                    fmt::format("'{}' needs one to three weights (train,valid,test)", split));
  while (w.size() < 3) w.push_back(0);
  double total = w[0] + w[1] + w[2];
  if (total <= 0) throw SpecError(pointer, fmt::format("'{}': the weights sum to zero", split));
  for (double& x : w) x /= total;
  return w;
}

std::vector<int64_t> split_boundaries(const std::vector<double>& weights, int64_t elements) {
  // Megatron-Core's split matrix: the running sum of the weights (added left to right, as
  // functools.reduce does), each bookend scaled and rounded by Python's round(), which is
  // round-half-to-even, the default floating-point rounding mode.
  std::vector<int64_t> b = {0};
  double cumulative = 0;
  for (double w : weights) {
    cumulative += w;
    b.push_back(static_cast<int64_t>(std::nearbyint(cumulative * static_cast<double>(elements))));
  }
  return b;
}

void blending_indices(const std::vector<double>& weights, int64_t size,
                      std::vector<int16_t>& dataset, std::vector<int64_t>& dataset_sample) {
  dataset.assign(static_cast<size_t>(size), 0);
  dataset_sample.assign(static_cast<size_t>(size), 0);
  std::vector<int64_t> taken(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    double x = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * x - static_cast<double>(taken[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      double error = weights[d] * x - static_cast<double>(taken[d]);
      if (error > best_error) best_error = error, best = d;
    }
    dataset[i] = static_cast<int16_t>(best);
    dataset_sample[i] = taken[best]++;
  }
}

}  // namespace loom::core
