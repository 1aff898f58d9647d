// Sampler: picks the next token from a row of logits (DESIGN.md section 7, `loom generate`).
//
// The rules, in the order they apply (those of Hugging Face's logits warpers):
//   temperature 0      greedy: the arg max (the lowest id among equal maxima); the other
//                      options are then ignored
//   temperature T > 0  p = softmax(logits / T)
//   top_k K > 0        keep the K most probable tokens (ties broken towards the lower id)
//   top_p P < 1        of those, keep the smallest set of most probable tokens whose
//                      probability sums to >= P (nucleus sampling; at least one token;
//                      a sum within 1e-6 below P counts, as f32 logits round)
// then draw from the kept tokens renormalised. Draws are reproducible for a seed on every
// platform: the generator is std::mt19937_64 (fully specified by the C++ standard) and a
// uniform number in [0, 1) is made from its output u as (u >> 11) * 2^-53, never with
// std::uniform_real_distribution, whose algorithm is left to the standard library.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace loom::core {

/// How to choose tokens.
struct SamplingOptions {
  double temperature = 1.0;  ///< >= 0; 0 is greedy decoding
  int64_t top_k = 0;         ///< >= 0; 0 keeps every token
  double top_p = 1.0;        ///< in (0, 1]; 1 keeps every token
  uint64_t seed = 0;         ///< seed of the random draws

  /// Throws InvalidArgument naming the option, its value and the allowed range.
  void validate() const;
};

class Sampler {
 public:
  /// \param options  validated here (InvalidArgument when out of range)
  explicit Sampler(const SamplingOptions& options);

  /// One token id in [0, vocab) drawn from `logits` (`vocab` floats) by the rules above.
  /// Throws InvalidArgument when vocab < 1, when a logit is NaN, or when every logit is
  /// -infinity.
  int32_t sample(const float* logits, int64_t vocab);

  /// The distribution that `sample` draws from: `vocab` probabilities, zero outside the kept
  /// tokens, summing to 1 (one-hot at the arg max for greedy decoding). Same errors.
  std::vector<double> distribution(const float* logits, int64_t vocab) const;

  /// The next uniform number in [0, 1) of the generator (53 random bits).
  double uniform();

  /// The lowest id among the largest logits. Throws InvalidArgument on NaN or vocab < 1.
  static int32_t argmax(const float* logits, int64_t vocab);

  const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  std::mt19937_64 engine_;
};

}  // namespace loom::core
