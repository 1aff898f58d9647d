// The sampling rules against their definitions: greedy is the arg max, top-k = 1 is greedy,
// top-p keeps exactly the nucleus of a crafted distribution, temperature divides the
// logits, draws follow the renormalised distribution (chi-square over many draws with a
// fixed seed) and a seed fixes the draws.
#include "core/infer/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "loom/cpp/error.h"

namespace loom {
namespace {

using core::Sampler;
using core::SamplingOptions;

std::vector<float> random_logits(int64_t n, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(static_cast<float>(static_cast<double>(engine() >> 11) * 0x1.0p-53 * 8.0 - 4.0));
  return out;
}

// Logits whose softmax is `p` (exactly up to rounding).
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

TEST(Sampler, GreedyIsArgmax) {
  Sampler greedy({0.0, 0, 1.0, 1});
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> l = random_logits(100, seed);
    int32_t best = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(greedy.sample(l.data(), 100), best);
    std::vector<double> p = greedy.distribution(l.data(), 100);
    EXPECT_EQ(p[best], 1.0);
    EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0.0), 1.0);
  }
  // Ties go to the lowest id; top-k and top-p do not matter.
  std::vector<float> tie = {0.f, 3.f, 1.f, 3.f};
  EXPECT_EQ(Sampler({0.0, 3, 0.5, 1}).sample(tie.data(), 4), 1);
  EXPECT_EQ(Sampler::argmax(tie.data(), 4), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  for (double temperature : {0.5, 1.0, 3.0}) {
    Sampler s({temperature, 1, 1.0, 7});
    for (uint64_t seed = 0; seed < 50; ++seed) {
      std::vector<float> l = random_logits(64, seed + 100);
      EXPECT_EQ(s.sample(l.data(), 64), Sampler::argmax(l.data(), 64));
    }
  }
}

TEST(Sampler, TopPKeepsExactlyTheNucleus) {
  // Probabilities 0.4 (id 2), 0.3 (id 0), 0.2 (id 3), 0.1 (id 1).
  std::vector<float> l = logits_of({0.3, 0.1, 0.4, 0.2});
  struct Want {
    double top_p;
    std::vector<double> p;
  };
  for (const Want& w : std::vector<Want>{
           {0.3, {0, 0, 1, 0}},                   // 0.4 >= 0.3
           {0.4, {0, 0, 1, 0}},                   // exactly 0.4
           {0.41, {0.3 / 0.7, 0, 0.4 / 0.7, 0}},  // 0.4 + 0.3
           {0.7, {0.3 / 0.7, 0, 0.4 / 0.7, 0}},   // exactly 0.7: no third token
           {0.75, {0.3 / 0.9, 0, 0.4 / 0.9, 0.2 / 0.9}},
           {0.95, {0.3, 0.1, 0.4, 0.2}},
           {1.0, {0.3, 0.1, 0.4, 0.2}},
       }) {
    SCOPED_TRACE("top_p " + std::to_string(w.top_p));
    std::vector<double> p = Sampler({1.0, 0, w.top_p, 1}).distribution(l.data(), 4);
    for (int i = 0; i < 4; ++i) {
      if (w.p[i] == 0)
        EXPECT_EQ(p[i], 0.0) << "id " << i;
      else
        EXPECT_NEAR(p[i], w.p[i], 1e-6) << "id " << i;
    }
  }
  // After top-k = 3 (0.4, 0.3, 0.2 renormalised to 4/9, 3/9, 2/9), top-p = 0.7 needs 2.
  std::vector<double> p = Sampler({1.0, 3, 0.7, 1}).distribution(l.data(), 4);
  EXPECT_NEAR(p[2], 4.0 / 7.0, 1e-6);
  EXPECT_NEAR(p[0], 3.0 / 7.0, 1e-6);
  EXPECT_EQ(p[1], 0.0);
  EXPECT_EQ(p[3], 0.0);
  // A tiny top_p still keeps one token.
  p = Sampler({1.0, 0, 1e-9, 1}).distribution(l.data(), 4);
  EXPECT_EQ(p[2], 1.0);
}

TEST(Sampler, TemperatureDividesTheLogits) {
  std::vector<float> l = random_logits(10, 3);
  for (double t : {0.25, 1.0, 2.0}) {
    std::vector<double> p = Sampler({t, 0, 1.0, 1}).distribution(l.data(), 10);
    double z = 0;
    for (float x : l) z += std::exp(x / t);
    for (int i = 0; i < 10; ++i) EXPECT_NEAR(p[i], std::exp(l[i] / t) / z, 1e-12);
  }
}

// Chi-square goodness of fit of `draws` draws against the sampler's own distribution,
// which is checked against the rules above; and tokens outside the kept set never appear.
TEST(Sampler, DrawsFollowTheRenormalisedDistribution) {
  std::vector<float> l = random_logits(12, 21);
  for (SamplingOptions o : {SamplingOptions{1.0, 0, 1.0, 5}, SamplingOptions{0.7, 5, 1.0, 6},
                            SamplingOptions{1.3, 0, 0.8, 7}, SamplingOptions{0.9, 8, 0.9, 8}}) {
    SCOPED_TRACE("temperature " + std::to_string(o.temperature) + " top_k " +
                 std::to_string(o.top_k) + " top_p " + std::to_string(o.top_p));
    Sampler s(o);
    std::vector<double> p = s.distribution(l.data(), 12);
    const int draws = 200000;
    std::vector<int> count(12, 0);
    for (int i = 0; i < draws; ++i) ++count[s.sample(l.data(), 12)];
    double chi2 = 0;
    int kept = 0;
    for (int i = 0; i < 12; ++i) {
      if (p[i] == 0) {
        EXPECT_EQ(count[i], 0) << "token " << i << " is outside the kept set";
        continue;
      }
      ++kept;
      double expected = p[i] * draws;
      chi2 += (count[i] - expected) * (count[i] - expected) / expected;
    }
    ASSERT_GE(kept, 2);
    // Chi-square with kept - 1 <= 11 degrees of freedom exceeds 40 with probability
    // < 1e-4; with the fixed seeds this is deterministic.
    EXPECT_LT(chi2, 40.0) << "degrees of freedom " << kept - 1;
    if (o.top_k > 0) {
      EXPECT_LE(kept, o.top_k);
    }
  }
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> l = random_logits(50, 4);
  Sampler a({1.0, 0, 1.0, 99}), b({1.0, 0, 1.0, 99}), c({1.0, 0, 1.0, 100});
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.sample(l.data(), 50));
    db.push_back(b.sample(l.data(), 50));
    dc.push_back(c.sample(l.data(), 50));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  // The uniform numbers are mt19937_64's output, top 53 bits, in [0, 1): the standard fixes
  // the 10000th output for the default seed 5489 as 9981545732273789042.
  Sampler d({1.0, 0, 1.0, 5489});
  for (int i = 1; i < 10000; ++i) d.uniform();
  EXPECT_EQ(d.uniform(), static_cast<double>(9981545732273789042ull >> 11) * 0x1.0p-53);
}

TEST(Sampler, RefusesBadOptionsAndLogits) {
  auto message = [](const SamplingOptions& o) {
    try {
      Sampler s(o);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({-0.5, 0, 1.0, 0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({NAN, 0, 1.0, 0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({1.0, -1, 1.0, 0}).find("top_k"), std::string::npos);
  EXPECT_NE(message({1.0, 0, 0.0, 0}).find("top_p"), std::string::npos);
  EXPECT_NE(message({1.0, 0, 1.5, 0}).find("(0, 1]"), std::string::npos);
  std::vector<float> bad = {0.f, NAN, 1.f};
  Sampler s({1.0, 0, 1.0, 0});
  EXPECT_THROW(s.sample(bad.data(), 3), Error);
  EXPECT_THROW(s.sample(bad.data(), 0), Error);
  std::vector<float> masked = {-INFINITY, -INFINITY};
  EXPECT_THROW(s.sample(masked.data(), 2), Error);
  // -infinity logits are never drawn.
  std::vector<float> some = {-INFINITY, 0.f, -INFINITY, 0.f};
  for (int i = 0; i < 100; ++i) {
    int32_t t = s.sample(some.data(), 4);
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

}  // namespace
}  // namespace loom
