#include "core/data/gpt_data.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "core/util/errors.h"
#include "core/util/log.h"

namespace loom::core {

namespace fs = std::filesystem;

// One split (train or valid) of the run: a GptDataset per contributing prefix and, with more
// than one, Megatron's blending indices over them.
struct GptData::Split {
  std::string name;
  std::vector<std::unique_ptr<GptDataset>> parts;
  std::vector<size_t> part_dataset;  // which prefix each part reads
  std::vector<double> weights;       // normalised, one per part
  std::vector<int16_t> blend_dataset;
  std::vector<int64_t> blend_sample;
  int64_t size = 0;

  void sample(int64_t index, int32_t* out) const {
    if (parts.size() == 1) {
      parts[0]->sample(index % parts[0]->size(), out);
      return;
    }
    int64_t i = index % size;
    const GptDataset& part = *parts[blend_dataset[i]];
    part.sample(blend_sample[i] % part.size(), out);
  }
};

namespace {

std::unique_ptr<GptData::Split> build_split(
    const std::string& name, int which, int64_t target,
    const std::vector<std::shared_ptr<const IndexedDataset>>& datasets,
    const std::vector<double>& weights, const std::vector<double>& split_weights,
    const GptIndexConfig& config) {
  auto split = std::make_unique<GptData::Split>();
  split->name = name;
  // Prefixes whose share of this split holds sequences (Megatron-Core splits a GPT dataset
  // by sequence: numel_low_level_dataset).
  std::vector<std::pair<size_t, std::pair<int64_t, int64_t>>> ranges;
  double total = 0;
  for (size_t d = 0; d < datasets.size(); ++d) {
    std::vector<int64_t> b = split_boundaries(split_weights, datasets[d]->sequences());
    if (b[which + 1] > b[which] && weights[d] > 0) {
      ranges.push_back({d, {b[which], b[which + 1]}});
      total += weights[d];
    }
  }
  if (ranges.empty() || target <= 0) return nullptr;
  for (const auto& r : ranges) split->weights.push_back(weights[r.first] / total);
  split->size = target;
  for (size_t p = 0; p < ranges.size(); ++p) {
    // Megatron's per-dataset size in a blend: ceil(ceil(target * weight) * 1.005).
    int64_t n = ranges.size() == 1
                    ? target
                    : static_cast<int64_t>(std::ceil(
                          std::ceil(static_cast<double>(target) * split->weights[p]) * 1.005));
    split->parts.push_back(std::make_unique<GptDataset>(datasets[ranges[p].first],
                                                        ranges[p].second.first,
                                                        ranges[p].second.second, n, name, config));
    split->part_dataset.push_back(ranges[p].first);
  }
  if (ranges.size() > 1)
    blending_indices(split->weights, target, split->blend_dataset, split->blend_sample);
  return split;
}

}  // namespace

void parse_data_paths(const nlohmann::json& paths, const std::string& pointer,
                      std::vector<fs::path>& prefixes, std::vector<double>& weights) {
  auto number = [](const nlohmann::json& v, double* out) {
    if (v.is_number()) {
      *out = v.get<double>();
      return true;
    }
    std::string s = v.get<std::string>();
    size_t used = 0;
    try {
      *out = std::stod(s, &used);
    } catch (const std::exception&) {
      return false;
    }
    return used == s.size();
  };
  prefixes.clear();
  weights.clear();
  if (!paths.is_array() || paths.empty())
    throw SpecError(pointer, "needs at least one dataset prefix");
  double w = 0;
  bool weighted = number(paths[0], &w);
  if (weighted && paths.size() % 2 != 0)
    throw SpecError(pointer,
                    "weighted blends are pairs: [weight, \"prefix\", weight, \"prefix\", ...]");
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string at = fmt::format("{}/{}", pointer, i);
    bool is_weight = weighted && i % 2 == 0;
    if (is_weight) {
      if (!number(paths[i], &w) || !(w >= 0))
        throw SpecError(at, "expected a non-negative blend weight");
      weights.push_back(w);
    } else {
      if (!paths[i].is_string() || number(paths[i], &w))
        throw SpecError(at, weighted ? "expected a dataset prefix after the weight"
                                     : "expected a dataset prefix (or give a weight before "
                                       "every prefix)");
      prefixes.emplace_back(paths[i].get<std::string>());
    }
  }
}

GptData::GptData(const GptDataOptions& options) : options_(options) {
  const std::string& ptr = options_.spec_pointer;
  if (options_.prefixes.empty()) throw SpecError(ptr + "/paths", "no dataset prefixes given");
  std::vector<double> weights = options_.weights;
  if (weights.empty()) weights.assign(options_.prefixes.size(), 1.0);
  if (weights.size() != options_.prefixes.size())
    throw SpecError(ptr + "/paths", fmt::format("{} weights for {} prefixes", weights.size(),
                                                options_.prefixes.size()));
  double total = 0;
  for (double w : weights) {
    if (!(w >= 0) || !std::isfinite(w))
      throw SpecError(ptr + "/paths",
                      fmt::format("blend weight {} is not a non-negative number", w));
    total += w;
  }
  if (total <= 0) throw SpecError(ptr + "/paths", "the blend weights sum to zero");
  for (double& w : weights) w /= total;
  if ((options_.eod_mask_loss || options_.reset_position_ids || options_.reset_attention_mask) &&
      !options_.eod)
    throw SpecError(ptr,
                    "eod_mask_loss / reset_position_ids / reset_attention_mask need the "
                    "end-of-document id: set " +
                        ptr + "/tokenizer (or " + ptr + "/eod_id)");
  split_weights_ = parse_split(options_.split, ptr + "/split");

  // Open each prefix once, even when it appears twice in the blend.
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened;
  for (const fs::path& prefix : options_.prefixes) {
    std::string key = fs::absolute(prefix).lexically_normal().string();
    auto& slot = opened[key];
    if (!slot) {
      if (!fs::exists(fs::path(prefix.string() + ".idx")))
        throw IoError(
            fmt::format("{}.idx: no such file (spec {}/paths names the prefix "
                        "'{}'; write it with `loom preprocess --output {}`)",
                        prefix.string(), ptr, prefix.string(), prefix.string()));
      slot = std::make_shared<const IndexedDataset>(prefix);
    }
    datasets_.push_back(slot);
  }

  GptIndexConfig config;
  config.seq_length = options_.seq_length;
  config.seed = options_.seed;
  config.cache_dir = options_.cache_dir;
  if (config.cache_dir.empty())
    config.cache_dir =
        fs::absolute(options_.prefixes[0]).parent_path() / "cache" / "GPTDataset_indices";
  train_ =
      build_split("train", 0, options_.train_samples, datasets_, weights, split_weights_, config);
  if (!train_)
    throw SpecError(ptr + "/split", fmt::format("'{}' leaves no training sequences in {}",
                                                options_.split, options_.prefixes[0].string()));
  valid_ =
      build_split("valid", 1, options_.valid_samples, datasets_, weights, split_weights_, config);
  window_.resize(static_cast<size_t>(options_.seq_length + 1));

  // Unigram entropy of the train split, each prefix weighted as the blend weights it.
  std::vector<double> p;
  std::vector<int32_t> buffer;
  for (size_t part = 0; part < train_->parts.size(); ++part) {
    const IndexedDataset& ds = *datasets_[train_->part_dataset[part]];
    std::vector<int64_t> b = split_boundaries(split_weights_, ds.sequences());
    std::vector<int64_t> counts;
    int64_t n = 0;
    for (int64_t s = b[0]; s < b[1]; ++s) {
      int64_t len = ds.sequence_lengths()[s];
      buffer.resize(static_cast<size_t>(len));
      ds.read(s, 0, len, buffer.data());
      for (int32_t id : buffer) {
        if (id >= static_cast<int64_t>(counts.size()))
          counts.resize(static_cast<size_t>(id) + 1, 0);
        if (id >= 0) ++counts[id], ++n;
      }
    }
    if (counts.size() > p.size()) p.resize(counts.size(), 0.0);
    for (size_t i = 0; i < counts.size(); ++i)
      p[i] += train_->weights[part] * static_cast<double>(counts[i]) / static_cast<double>(n);
  }
  for (double q : p)
    if (q > 0) unigram_entropy_ -= q * std::log(q);
}

GptData::~GptData() = default;

void GptData::train_sample(int64_t index, int32_t* out) const { train_->sample(index, out); }

void GptData::fill(const Split& split, int64_t sample, int64_t row, Batch& out) const {
  const int64_t t = options_.seq_length;
  split.sample(sample, window_.data());
  for (int64_t i = 0; i <= t; ++i)
    if (window_[i] < 0 || window_[i] >= options_.vocab_size)
      throw IoError(fmt::format(
          "{} sample {}: token id {} is outside the model's vocabulary [0, {}); the dataset "
          "was written with a larger tokenizer than /model/vocab_size allows",
          split.name, sample, window_[i], options_.vocab_size));
  int32_t* tokens = out.tokens.data() + row * t;
  int32_t* labels = out.labels.data() + row * t;
  float* mask = out.loss_mask.data() + row * t;
  std::copy(window_.begin(), window_.begin() + t, tokens);
  std::copy(window_.begin() + 1, window_.end(), labels);
  const bool eod_known = options_.eod.has_value();
  const int32_t eod = eod_known ? *options_.eod : -1;
  for (int64_t i = 0; i < t; ++i) mask[i] = options_.eod_mask_loss && tokens[i] == eod ? 0.f : 1.f;
  if (options_.reset_position_ids) {
    int32_t* pos = out.position_ids.data() + row * t;
    int32_t start = 0;
    for (int64_t i = 0; i < t; ++i) {
      pos[i] = static_cast<int32_t>(i) - start;
      if (tokens[i] == eod) start = static_cast<int32_t>(i) + 1;
    }
  }
  if (options_.reset_attention_mask) {
    int32_t* seg = out.segment_ids.data() + row * t;
    int32_t s = 0;
    for (int64_t i = 0; i < t; ++i) {
      seg[i] = s;
      if (tokens[i] == eod) ++s;
    }
  }
}

void GptData::next_train(Batch& out) {
  out.resize(options_.batch, options_.seq_length);
  size_t n = static_cast<size_t>(options_.batch * options_.seq_length);
  if (options_.reset_position_ids) out.position_ids.assign(n, 0);
  if (options_.reset_attention_mask) out.segment_ids.assign(n, 0);
  for (int64_t b = 0; b < options_.batch; ++b) fill(*train_, position_++, b, out);
}

bool GptData::valid_batch(int64_t index, Batch& out) {
  if (!valid_) return false;
  out.resize(options_.batch, options_.seq_length);
  size_t n = static_cast<size_t>(options_.batch * options_.seq_length);
  if (options_.reset_position_ids) out.position_ids.assign(n, 0);
  if (options_.reset_attention_mask) out.segment_ids.assign(n, 0);
  for (int64_t b = 0; b < options_.batch; ++b) fill(*valid_, index * options_.batch + b, b, out);
  return true;
}

std::string GptData::describe() const {
  std::string s;
  for (size_t d = 0; d < datasets_.size(); ++d) {
    const IndexedDataset& ds = *datasets_[d];
    std::string sequences = ds.sequences() == ds.documents()
                                ? std::string()
                                : fmt::format(" in {} sequences", ds.sequences());
    s += fmt::format("{}{} ({}, {} documents{}, {} tokens)", d ? " + " : "",
                     ds.prefix().string(), indexed_dtype_name(ds.dtype()), ds.documents(),
                     sequences, ds.tokens());
  }
  auto split_text = [](const Split* sp) -> std::string {
    if (sp == nullptr) return "none";
    int64_t epochs = 0;
    bool cached = true;
    for (const auto& p : sp->parts)
      epochs = std::max(epochs, p->epochs()), cached &= p->from_cache();
    return fmt::format("{} samples ({} epoch{}{})", sp->size, epochs, epochs == 1 ? "" : "s",
                       cached ? ", indices from cache" : "");
  };
  return fmt::format("{}; split {}: train {}, valid {}; unigram entropy {:.3f} nats/token", s,
                     options_.split, split_text(train_.get()), split_text(valid_.get()),
                     unigram_entropy_);
}

}  // namespace loom::core
