#include "core/train/step_metrics.h"

#include "core/util/gather_text.h"

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
    std::vector<std::string> texts = all_gather_text(*world, mine.dump(), "gathering the metrics");
    all.clear();
    for (const std::string& text : texts) {
      nlohmann::json theirs = nlohmann::json::parse(text);
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
