#include "plugins/transformer/rotary.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

int32_t rotary_dim(const nlohmann::json& rotary, int64_t head_dim) {
  double percent = rotary.value("percent", 1.0);
  if (!(percent > 0.0 && percent <= 1.0))
    invalid("/rotary/percent: must be in (0, 1], got " + std::to_string(percent));
  auto dim = static_cast<int64_t>(static_cast<double>(head_dim) * percent);
  if (dim < 2 || dim % 2 != 0)
    invalid("/rotary/percent: " + std::to_string(percent) + " of the head dimension " +
            std::to_string(head_dim) + " gives a rotary dimension of " + std::to_string(dim) +
            ", which must be even and at least 2: choose a percent giving an even number");
  return static_cast<int32_t>(dim);
}

std::vector<float> rotary_inv_freq(const nlohmann::json& rotary, int32_t rotary_dim) {
  double base = rotary.value("base", 10000.0);
  if (!(base > 1.0)) invalid("/rotary/base: must be > 1, got " + std::to_string(base));
  std::vector<double> inv(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / rotary_dim);

  nlohmann::json scaling = rotary.value("scaling", nlohmann::json::object());
  std::string type = scaling.value("type", "none");
  double factor = scaling.value("factor", 8.0);
  if (type != "none" && !(factor >= 1.0))
    invalid("/rotary/scaling/factor: must be >= 1, got " + std::to_string(factor));
  if (type == "linear") {
    for (double& f : inv) f /= factor;
  } else if (type == "llama3") {
    double low = scaling.value("low_freq_factor", 1.0);
    double high = scaling.value("high_freq_factor", 4.0);
    double old_len = scaling.value("original_max_position_embeddings", 8192.0);
    if (!(high > low))
      invalid("/rotary/scaling/high_freq_factor: must exceed low_freq_factor (" +
              std::to_string(low) + "), got " + std::to_string(high));
    double low_wavelen = old_len / low, high_wavelen = old_len / high;
    for (double& f : inv) {
      double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= factor;  // long wavelengths: interpolate fully
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_len / wavelen - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;  // medium: blend
      }                                              // short wavelengths unchanged
    }
  } else if (type != "none") {
    invalid("/rotary/scaling/type: '" + type + "' is not one of none, linear, llama3");
  }
  return std::vector<float>(inv.begin(), inv.end());
}

RotaryTable::RotaryTable(IHost& host, Device device, const std::vector<float>& inv_freq)
    : host_(host) {
  void* data = nullptr;
  uint64_t bytes = inv_freq.size() * sizeof(float);
  throw_if_error(host.allocate(device, bytes, 64, &data));
  view_ = make_view(data, DType::kF32, {static_cast<int64_t>(inv_freq.size())}, device);
  throw_if_error(host.copy(device, data, kCpu, inv_freq.data(), bytes),
                 "rope: inverse frequencies");
}

RotaryTable::~RotaryTable() { host_.deallocate(view_.device, view_.data); }

}  // namespace loom::transformer
