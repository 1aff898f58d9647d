// RoPE inverse frequencies: plain, linear scaling, Llama 3 scaling against values from HF
// transformers' `_compute_llama3_parameters` formula (all three wavelength regimes), and YaRN
// (inverse frequencies and attention factor) against the published formula (Peng et al.
// 2023 as HF's `_compute_yarn_parameters` and Megatron-Core's YarnRotaryEmbedding write it),
// recomputed here in long double, plus the worked ramp bounds of next-capabilities.md
// section 8.
#include "plugins/transformer/rotary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numbers>
#include <string>

namespace loom::transformer {
namespace {

using nlohmann::json;

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << i;
}

TEST(Rotary, PlainAndLinear) {
  std::vector<double> plain;
  for (int i = 0; i < 16; i += 2) plain.push_back(1.0 / std::pow(10000.0, i / 16.0));
  expect_near_all(rotary_inv_freq({{"base", 10000}}, 16), plain);
  for (double& f : plain) f /= 4;
  expect_near_all(
      rotary_inv_freq({{"base", 10000}, {"scaling", {{"type", "linear"}, {"factor", 4}}}}, 16),
      plain);
}

TEST(Rotary, Llama3MatchesHuggingFace) {
  json rotary = {{"base", 10000},
                 {"scaling",
                  {{"type", "llama3"},
                   {"factor", 8},
                   {"low_freq_factor", 1},
                   {"high_freq_factor", 4},
                   {"original_max_position_embeddings", 32}}}};
  expect_near_all(rotary_inv_freq(rotary, 16),
                  {1.0, 0.09583998588296266, 0.0125, 0.003952847075210474, 0.00125,
                   0.00039528470752104737, 0.000125, 3.952847075210474e-05});
}

TEST(Rotary, DimensionFromPercent) {
  EXPECT_EQ(rotary_dim({{"percent", 1.0}}, 64), 64);
  EXPECT_EQ(rotary_dim({{"percent", 0.25}}, 64), 16);
  EXPECT_THROW(rotary_dim({{"percent", 0.3}}, 10), Error);  // 3 channels: odd
  EXPECT_THROW(rotary_dim({{"percent", 0.0}}, 64), Error);
}

// ---- YaRN --------------------------------------------------------------------------------

json yarn(double base, double factor, double original, json extra = json::object()) {
  json scaling = {
      {"type", "yarn"}, {"factor", factor}, {"original_max_position_embeddings", original}};
  scaling.update(extra);
  return {{"base", base}, {"scaling", scaling}};
}

// The published YaRN frequencies, written out here: pair i of d channels has the plain
// frequency theta_i = base^(-2i/d); the correction dim of r rotations is
// c(r) = d ln(L0 / (2 pi r)) / (2 ln base); low = max(floor(c(beta_fast)), 0),
// high = min(ceil(c(beta_slow)), d - 1) (unrounded when !truncate), high += 0.001 when
// equal; gamma_i = clamp((i - low) / (high - low), 0, 1) and
// inv_freq_i = (1 - gamma_i) theta_i + gamma_i theta_i / s.
struct YarnWant {
  std::vector<long double> inv;
  long double low, high;
};
YarnWant yarn_formula(long double base, long double s, long double l0, int d,
                      long double beta_fast = 32, long double beta_slow = 1, bool truncate = true) {
  const long double pi = std::numbers::pi_v<long double>;
  auto c = [&](long double r) { return d * std::log(l0 / (2 * pi * r)) / (2 * std::log(base)); };
  YarnWant w{{}, c(beta_fast), c(beta_slow)};
  if (truncate) w.low = std::floor(w.low), w.high = std::ceil(w.high);
  w.low = std::max(w.low, 0.0L);
  w.high = std::min(w.high, static_cast<long double>(d - 1));
  long double high = w.low == w.high ? w.high + 0.001L : w.high;
  for (int i = 0; i < d / 2; ++i) {
    long double theta = std::pow(base, -2.0L * i / d);
    long double gamma = std::clamp((i - w.low) / (high - w.low), 0.0L, 1.0L);
    w.inv.push_back((1 - gamma) * theta + gamma * theta / s);
  }
  return w;
}

// Largest relative error of `got` against `want`, printed; every entry within 1e-6.
double check_relative(const std::vector<float>& got, const std::vector<long double>& want,
                      const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    double err = static_cast<double>(std::fabs((got[i] - want[i]) / want[i]));
    EXPECT_LE(err, 1e-6) << what << " pair " << i << ": " << got[i] << " vs "
                         << static_cast<double>(want[i]);
    worst = std::max(worst, err);
  }
  std::printf("yarn %-44s max relative error %.3g over %zu pairs\n", what.c_str(), worst,
              want.size());
  return worst;
}

TEST(Rotary, YarnInverseFrequenciesMatchTheFormula) {
  struct Case {
    const char* name;
    double base, s, l0;
    int d;
    json extra;
  };
  const Case cases[] = {
      {"DeepSeek-V3 (d 64, b 1e4, L0 4096, s 40)", 1e4, 40, 4096, 64, json::object()},
      {"Qwen (d 128, b 1e6, L0 32768, s 4)", 1e6, 4, 32768, 128, json::object()},
      {"tiny (d 16, b 1e4, L0 1024, s 4)", 1e4, 4, 1024, 16, json::object()},
      {"betas 16 / 2 (d 32, b 5e5, L0 8192, s 8)",
       5e5,
       8,
       8192,
       32,
       {{"beta_fast", 16}, {"beta_slow", 2}}},
      {"low = high (d 16, b 1e4, L0 4, s 2)", 1e4, 2, 4, 16, json::object()},
      {"untruncated (d 64, b 1e4, L0 4096, s 40)", 1e4, 40, 4096, 64, {{"truncate", false}}},
  };
  for (const Case& c : cases) {
    YarnWant want = yarn_formula(c.base, c.s, c.l0, c.d, c.extra.value("beta_fast", 32.0),
                                 c.extra.value("beta_slow", 1.0), c.extra.value("truncate", true));
    check_relative(rotary_inv_freq(yarn(c.base, c.s, c.l0, c.extra), c.d), want.inv, c.name);
  }
  // The worked bounds of next-capabilities.md section 8: pairs up to low keep base^(-2i/d),
  // pairs from high on are divided by s exactly.
  struct Bounds {
    double base, s, l0;
    int d, low, high;
  };
  for (const Bounds& b : {Bounds{1e4, 40, 4096, 64, 10, 23}, Bounds{1e6, 4, 32768, 128, 23, 40}}) {
    YarnWant want = yarn_formula(b.base, b.s, b.l0, b.d);
    EXPECT_EQ(want.low, b.low);
    EXPECT_EQ(want.high, b.high);
    std::vector<float> got = rotary_inv_freq(yarn(b.base, b.s, b.l0), b.d);
    for (int i = 0; i < b.d / 2; ++i) {
      double theta = std::pow(b.base, -2.0 * i / b.d);
      if (i <= b.low) {
        EXPECT_NEAR(got[i], theta, 1e-6 * theta) << i;
      } else if (i >= b.high) {
        EXPECT_NEAR(got[i], theta / b.s, 1e-6 * theta / b.s) << i;
      } else {
        EXPECT_TRUE(got[i] < theta && got[i] > theta / b.s) << i;
      }
    }
  }
}

TEST(Rotary, YarnAttentionFactor) {
  auto mscale = [](long double s, long double m) {
    return s <= 1 ? 1.0L : 0.1L * m * std::log(s) + 1.0L;
  };
  struct Case {
    const char* name;
    json rotary;
    long double want;
  };
  const Case cases[] = {
      {"s 4: 0.1 ln 4 + 1", yarn(1e6, 4, 32768), mscale(4, 1)},
      {"s 40: 0.1 ln 40 + 1", yarn(1e4, 40, 4096), mscale(40, 1)},
      {"s 1: 1", yarn(1e4, 1, 4096), 1.0L},
      {"DeepSeek mscale 1 / mscale_all_dim 0.707",
       yarn(1e4, 40, 4096, {{"mscale", 1.0}, {"mscale_all_dim", 0.707}}),
       mscale(40, 1.0) / mscale(40, 0.707)},
      {"DeepSeek mscale = mscale_all_dim = 1",
       yarn(1e4, 40, 4096, {{"mscale", 1}, {"mscale_all_dim", 1}}), 1.0L},
      {"mscale_all_dim 0: as unset", yarn(1e4, 40, 4096, {{"mscale", 2}, {"mscale_all_dim", 0}}),
       mscale(40, 1)},
      {"attention_factor 1.5 wins",
       yarn(1e4, 40, 4096, {{"attention_factor", 1.5}, {"mscale", 2}, {"mscale_all_dim", 1}}),
       1.5L},
  };
  double worst = 0;
  for (const Case& c : cases) {
    double got = rotary_attention_factor(c.rotary, 64, 64);
    double err = static_cast<double>(std::fabs((got - c.want) / c.want));
    EXPECT_LE(err, 1e-15) << c.name << ": " << got << " vs " << static_cast<double>(c.want);
    worst = std::max(worst, err);
  }
  std::printf("yarn attention factor: max relative error %.3g over %zu cases\n", worst,
              std::size(cases));
  EXPECT_NEAR(rotary_attention_factor(yarn(1e6, 4, 32768), 128, 128), 1.138629, 1e-6);  // §8
  EXPECT_NEAR(rotary_attention_factor(yarn(1e4, 40, 4096), 64, 64), 1.368888, 1e-6);
  EXPECT_EQ(rotary_attention_factor({{"base", 10000}}, 16, 16), 1.0);
  EXPECT_EQ(rotary_attention_factor({{"scaling", {{"type", "llama3"}, {"factor", 8}}}}, 16, 32),
            1.0);
}

// A refusal names the spec key and says how to fix it.
void expect_refused(const std::function<void()>& build, const std::string& pointer,
                    const std::string& words) {
  try {
    build();
    ADD_FAILURE() << "accepted; expected a refusal at " << pointer;
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(pointer + ":"), std::string::npos) << what;
    EXPECT_NE(what.find(words), std::string::npos) << what;
  }
}

TEST(Rotary, YarnRefusesBadValues) {
  auto inv = [](json rotary) { return [rotary] { rotary_inv_freq(rotary, 16); }; };
  expect_refused(inv(yarn(1e4, 0, 1024)), "/rotary/scaling/factor", "> 0");
  expect_refused(inv(yarn(1e4, -2, 1024)), "/rotary/scaling/factor", "> 0");
  expect_refused(inv(yarn(1e4, 0.5, 1024)), "/rotary/scaling/factor", ">= 1");
  expect_refused(inv(yarn(1e4, 4, 1024, {{"beta_fast", 1}, {"beta_slow", 1}})),
                 "/rotary/scaling/beta_fast", "must exceed beta_slow");
  expect_refused(inv(yarn(1e4, 4, 1024, {{"beta_fast", 2}, {"beta_slow", 8}})),
                 "/rotary/scaling/beta_fast", "the defaults are 32 and 1");
  expect_refused(inv(yarn(1e4, 4, 1024, {{"beta_slow", 0}})), "/rotary/scaling/beta_slow", "> 0");
  expect_refused(inv(yarn(1e4, 4, 0)), "/rotary/scaling/original_max_position_embeddings", "> 0");
  json no_length = yarn(1e4, 4, 1024);
  no_length["scaling"].erase("original_max_position_embeddings");
  expect_refused(inv(no_length), "/rotary/scaling/original_max_position_embeddings",
                 "missing; yarn needs the context length the model was pretrained with");
  json no_factor = yarn(1e4, 4, 1024);
  no_factor["scaling"].erase("factor");
  expect_refused(inv(no_factor), "/rotary/scaling/factor", "missing; yarn needs");
  expect_refused(inv({{"scaling", {{"type", "ntk"}}}}), "/rotary/scaling/type", "yarn");
  // The factor is applied to all of q and k, so partial rotary needs it to be 1.
  expect_refused([] { rotary_attention_factor(yarn(1e4, 4, 1024), 8, 16); }, "/rotary/percent",
                 "use percent 1");
  EXPECT_EQ(rotary_attention_factor(yarn(1e4, 4, 1024, {{"attention_factor", 1}}), 8, 16), 1.0);
}

}  // namespace
}  // namespace loom::transformer
