// RoPE inverse frequencies: plain, linear scaling, and Llama 3 scaling against values from
// HF transformers' `_compute_llama3_parameters` formula (all three wavelength regimes).
#include "plugins/transformer/rotary.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace loom::transformer
