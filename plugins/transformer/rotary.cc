#include "plugins/transformer/rotary.h"

#include <algorithm>
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

namespace {

const char* kScalingTypes = "none, linear, llama3, yarn";

// A positive number under "/rotary/scaling/<key>", or `fallback` when absent.
double positive(const nlohmann::json& scaling, const char* key, double fallback) {
  auto it = scaling.find(key);
  if (it == scaling.end() || it->is_null()) return fallback;
  if (!it->is_number() || !(it->get<double>() > 0.0))
    invalid(std::string("/rotary/scaling/") + key + ": must be a number > 0, got " + it->dump());
  return it->get<double>();
}

// The YaRN parameters of "/rotary/scaling" (type yarn), validated. factor and
// original_max_position_embeddings have no default (HF's _validate_yarn_parameters requires
// them); beta_fast / beta_slow default to 32 / 1.
struct Yarn {
  double factor, original_len, beta_fast, beta_slow;
  bool truncate;
};

Yarn read_yarn(const nlohmann::json& scaling) {
  for (const char* key : {"factor", "original_max_position_embeddings"})
    if (!scaling.contains(key) || scaling[key].is_null())
      invalid(std::string("/rotary/scaling/") + key + ": missing; yarn needs " +
              (std::string(key) == "factor"
                   ? "the context extension factor (e.g. 4 for 4x the original length)"
                   : "the context length the model was pretrained with (HF's "
                     "rope_scaling.original_max_position_embeddings, e.g. 32768)"));
  Yarn y{positive(scaling, "factor", 1.0),
         positive(scaling, "original_max_position_embeddings", 1.0),
         positive(scaling, "beta_fast", 32.0), positive(scaling, "beta_slow", 1.0),
         scaling.value("truncate", true)};
  if (!(y.factor >= 1.0))
    invalid("/rotary/scaling/factor: must be >= 1, got " + std::to_string(y.factor));
  if (!(y.beta_fast > y.beta_slow))
    invalid("/rotary/scaling/beta_fast: must exceed beta_slow (" + std::to_string(y.beta_slow) +
            "), got " + std::to_string(y.beta_fast) + "; the defaults are 32 and 1");
  return y;
}

// YaRN's magnitude correction 0.1 * mscale * ln(s) + 1 (1 when s <= 1).
double yarn_mscale(double s, double mscale) {
  return s <= 1.0 ? 1.0 : 0.1 * mscale * std::log(s) + 1.0;
}

// YaRN (HF's _compute_yarn_parameters, Megatron-Core's YarnRotaryEmbedding): channel pair i
// has wavelength 2 pi * base^(2i / d), and c(r) is the (fractional) pair index whose
// wavelength fits r times into the original context. Pairs below c(beta_fast) keep their frequency
// (extrapolated), pairs above c(beta_slow) are divided by factor (interpolated), and a
// linear ramp blends the two in between.
void yarn_inv_freq(const Yarn& y, double base, int32_t rotary_dim, std::vector<double>& inv) {
  const double d = rotary_dim;
  auto correction_dim = [&](double rotations) {
    return d * std::log(y.original_len / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {  // HF's truncate / Megatron's correction_range_round_to_int
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;  // as the sources do, against a zero-width ramp
  for (size_t i = 0; i < inv.size(); ++i) {
    double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    inv[i] = inv[i] / y.factor * ramp + inv[i] * (1 - ramp);
  }
}

}  // namespace

std::vector<float> rotary_inv_freq(const nlohmann::json& rotary, int32_t rotary_dim) {
  double base = rotary.value("base", 10000.0);
  if (!(base > 1.0)) invalid("/rotary/base: must be > 1, got " + std::to_string(base));
  std::vector<double> inv(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / rotary_dim);

  nlohmann::json scaling = rotary.value("scaling", nlohmann::json::object());
  std::string type = scaling.value("type", "none");
  if (type == "yarn") {
    yarn_inv_freq(read_yarn(scaling), base, rotary_dim, inv);
    return std::vector<float>(inv.begin(), inv.end());
  }
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
    invalid("/rotary/scaling/type: '" + type + "' is not one of " + kScalingTypes);
  }
  return std::vector<float>(inv.begin(), inv.end());
}

double rotary_attention_factor(const nlohmann::json& rotary, int32_t rotary_dim, int64_t head_dim) {
  nlohmann::json scaling = rotary.value("scaling", nlohmann::json::object());
  if (scaling.value("type", "none") != "yarn") return 1.0;
  const Yarn y = read_yarn(scaling);
  // HF: an explicit attention_factor wins; else the DeepSeek ratio when mscale and
  // mscale_all_dim are both set and non-zero (HF tests them for truth); else 0.1 ln(s) + 1.
  double m = positive(scaling, "attention_factor", 0.0);
  if (m == 0.0) {
    double mscale = scaling.value("mscale", 0.0), all_dim = scaling.value("mscale_all_dim", 0.0);
    m = mscale != 0.0 && all_dim != 0.0
            ? yarn_mscale(y.factor, mscale) / yarn_mscale(y.factor, all_dim)
            : yarn_mscale(y.factor, 1.0);
  }
  if (!std::isfinite(m) || !(m > 0.0))
    invalid(
        "/rotary/scaling/mscale_all_dim: the attention factor mscale(factor, mscale) / "
        "mscale(factor, mscale_all_dim) is " +
        std::to_string(m) + ", not a positive number: check mscale and mscale_all_dim");
  // loom applies the factor to the whole of q and k (a scale after rope); the sources scale
  // cos and sin, which leaves the channels past rotary_dim unscaled.
  if (m != 1.0 && rotary_dim != head_dim)
    invalid("/rotary/percent: yarn's attention factor (" + std::to_string(m) +
            ") with partial rotary embeddings (" + std::to_string(rotary_dim) + " of " +
            std::to_string(head_dim) +
            " channels) is not supported: use percent 1, or set "
            "/rotary/scaling/attention_factor to 1");
  return m;
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
