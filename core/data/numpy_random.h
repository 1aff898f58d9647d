// numpy's legacy RandomState (MT19937), as far as Megatron's dataset indices use it:
// `numpy.random.RandomState(seed)` followed by `shuffle` of 1-D arrays. Reproducing it
// exactly makes loom's document and shuffle indices equal Megatron's for the same seed,
// so a run reads the same samples in the same order under either framework.
#pragma once

#include <cstdint>
#include <span>

namespace loom::core {

class NumpyRandomState {
 public:
  /// `numpy.random.RandomState(seed)` for 0 <= seed < 2^32 (MT19937 init_genrand).
  explicit NumpyRandomState(uint32_t seed);

  /// The next 32 random bits (MT19937 genrand_int32).
  uint32_t next_uint32();
  /// A uniform integer in [0, max] by masked rejection (numpy's random_interval).
  uint64_t interval(uint64_t max);

  /// `RandomState.shuffle(x)` on a 1-D array: Fisher-Yates from the end, drawing
  /// interval(i) for i = n-1 .. 1.
  template <typename T>
  void shuffle(std::span<T> x) {
    for (int64_t i = static_cast<int64_t>(x.size()) - 1; i > 0; --i) {
      auto j = static_cast<int64_t>(interval(static_cast<uint64_t>(i)));
      T tmp = x[j];
      x[j] = x[i];
      x[i] = tmp;
    }
  }

 private:
  void generate();
  uint32_t state_[624];
  int pos_ = 624;
};

}  // namespace loom::core
