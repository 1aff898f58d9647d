#include "core/train/step_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "loom/cpp/error.h"
#include "loom/cpp/tensor.h"

namespace loom::core {

StepMetrics::StepMetrics(IHost& host, Device device) : host_(host), device_(device) {}

StepMetrics::~StepMetrics() { host_.deallocate(device_, staging_); }

void StepMetrics::add(const std::string& name, MetricReduce reduce, double value) {
  Figure& f = interval_[name];
  f.reduce = reduce;
  f.max = f.count == 0 ? value : std::max(f.max, value);
  f.sum += value;
  ++f.count;
}

void StepMetrics::record(const std::string& name, const TensorView& value, MetricReduce reduce) {
  if (value.device.type == DeviceType::kCpu) {
    add(name, reduce, *static_cast<const float*>(value.data));
    return;
  }
  if (static_cast<int64_t>(pending_.size()) == kSlots) end_step();  // staging full: read it
  // Staged on the device the modules name (the one their kernels run on).
  if (staging_ == nullptr) {
    device_ = value.device;
    throw_if_error(host_.allocate(device_, kSlots * sizeof(float), 64, &staging_),
                   "metric staging buffer");
  }
  float* slot = static_cast<float*>(staging_) + pending_.size();
  throw_if_error(host_.copy(device_, slot, value.device, value.data, sizeof(float)),
                 fmt::format("copying metric {}", name));
  pending_.emplace_back(name, reduce);
}

void StepMetrics::end_step() {
  if (pending_.empty()) return;
  std::vector<float> values(pending_.size());
  throw_if_error(host_.copy(kCpu, values.data(), device_, staging_, values.size() * sizeof(float)),
                 "reading the step's metrics");
  for (size_t i = 0; i < pending_.size(); ++i)
    add(pending_[i].first, pending_[i].second, values[i]);
  pending_.clear();
}

std::map<std::string, double> StepMetrics::take(ICommunicator* world) {
  end_step();
  std::map<std::string, Figure> all = std::move(interval_);
  interval_.clear();
  if (world != nullptr && world->size() > 1) {
    // Every rank's figures, as JSON text: the lengths first, then the padded texts.
    nlohmann::json mine = nlohmann::json::object();
    for (const auto& [name, f] : all)
      mine[name] = {static_cast<int32_t>(f.reduce), f.sum, f.count, f.max};
    std::string text = mine.dump();
    const int32_t n = world->size();
    std::vector<int64_t> lengths(static_cast<size_t>(n));
    int64_t length = static_cast<int64_t>(text.size());
    TensorView in = make_view(&length, DType::kI64, {1});
    TensorView out = make_view(lengths.data(), DType::kI64, {n});
    throw_if_error(world->all_gather(&in, &out, nullptr), "gathering the metrics' sizes");
    int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    std::string padded = text + std::string(static_cast<size_t>(longest) - text.size(), ' ');
    std::vector<char> texts(static_cast<size_t>(longest * n));
    in = make_view(padded.data(), DType::kU8, {longest});
    out = make_view(texts.data(), DType::kU8, {longest * n});
    if (longest > 0) throw_if_error(world->all_gather(&in, &out, nullptr), "gathering the metrics");
    all.clear();
    for (int32_t r = 0; r < n; ++r) {
      nlohmann::json theirs =
          nlohmann::json::parse(texts.begin() + r * longest,
                                texts.begin() + r * longest + lengths[static_cast<size_t>(r)]);
      for (const auto& [name, v] : theirs.items()) {
        Figure& f = all[name];
        double max = v[3].get<double>();
        f.max = f.count == 0 ? max : std::max(f.max, max);
        f.reduce = static_cast<MetricReduce>(v[0].get<int32_t>());
        f.sum += v[1].get<double>();
        f.count += v[2].get<int64_t>();
      }
    }
  }
  std::map<std::string, double> values;
  for (const auto& [name, f] : all)
    values[name] = f.reduce == MetricReduce::kMax ? f.max : f.sum / static_cast<double>(f.count);
  return values;
}

}  // namespace loom::core
