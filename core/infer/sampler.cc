#include "core/infer/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/util/errors.h"

namespace loom::core {
namespace {

// A cumulative probability this close below top_p counts as reaching it: logits are f32
// (relative error ~6e-8 in each probability), and a set that holds P up to that rounding
// must not pull in one more token because of it.
constexpr double kTopPSlack = 1e-6;

void check_logits(const float* logits, int64_t vocab) {
  if (vocab < 1) throw InvalidArgument(fmt::format("sampler: {} logits; need at least 1", vocab));
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isnan(logits[i]))
      throw InvalidArgument(
          fmt::format("sampler: logit {} is NaN: the model's output is not finite (check the "
                      "checkpoint's weights)",
                      i));
}

}  // namespace

void SamplingOptions::validate() const {
  if (!(temperature >= 0.0) || std::isinf(temperature))
    throw InvalidArgument(
        fmt::format("sampling temperature {}: must be a finite number >= 0 (0 is greedy decoding)",
                    temperature));
  if (top_k < 0)
    throw InvalidArgument(
        fmt::format("sampling top_k {}: must be >= 0 (0 keeps every token)", top_k));
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw InvalidArgument(
        fmt::format("sampling top_p {}: must be in (0, 1] (1 keeps every token)", top_p));
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), engine_(options.seed) {
  options_.validate();
}

double Sampler::uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

int32_t Sampler::argmax(const float* logits, int64_t vocab) {
  check_logits(logits, vocab);
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

std::vector<double> Sampler::distribution(const float* logits, int64_t vocab) const {
  check_logits(logits, vocab);
  std::vector<double> p(static_cast<size_t>(vocab), 0.0);
  if (options_.temperature == 0.0) {
    p[static_cast<size_t>(argmax(logits, vocab))] = 1.0;
    return p;
  }
  float top = *std::max_element(logits, logits + vocab);
  if (top == -INFINITY)
    throw InvalidArgument("sampler: every logit is -infinity; there is no token to choose");
  // Unnormalised softmax(logits / T) (+inf logits would give NaN: treat them as the max).
  for (int64_t i = 0; i < vocab; ++i)
    p[i] =
        logits[i] == top ? 1.0 : std::exp((double(logits[i]) - double(top)) / options_.temperature);
  bool top_k = options_.top_k > 0 && options_.top_k < vocab;
  bool top_p = options_.top_p < 1.0;
  if (top_k || top_p) {
    // Most probable first; equal logits keep id order.
    std::vector<int64_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    auto before = [&](int64_t a, int64_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    int64_t kept = top_k ? options_.top_k : vocab;
    if (top_k)
      std::partial_sort(order.begin(), order.begin() + kept, order.end(), before);
    else
      std::sort(order.begin(), order.end(), before);
    if (top_p) {
      double total = 0;
      for (int64_t j = 0; j < kept; ++j) total += p[order[j]];
      double cumulative = 0;
      int64_t n = 0;
      while (n < kept) {
        cumulative += p[order[n]] / total;
        ++n;
        if (cumulative >= options_.top_p - kTopPSlack) break;
      }
      kept = n;
    }
    std::vector<double> q(static_cast<size_t>(vocab), 0.0);
    for (int64_t j = 0; j < kept; ++j) q[order[j]] = p[order[j]];
    p.swap(q);
  }
  double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= sum;
  return p;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (options_.temperature == 0.0) return argmax(logits, vocab);
  std::vector<double> p = distribution(logits, vocab);
  double u = uniform();
  double cumulative = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (p[i] == 0.0) continue;
    cumulative += p[i];
    last = i;
    if (u < cumulative) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // u at the top of [0, 1) beyond a rounded sum
}

}  // namespace loom::core
