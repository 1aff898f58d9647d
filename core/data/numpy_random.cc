#include "core/data/numpy_random.h"

namespace loom::core {

NumpyRandomState::NumpyRandomState(uint32_t seed) {
  state_[0] = seed;
  for (uint32_t i = 1; i < 624; ++i)
    state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + i;
  pos_ = 624;
}

// Regenerates the 624-word block (Matsumoto and Nishimura's recurrence).
void NumpyRandomState::generate() {
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kMatrix = 0x9908b0dfu;
  for (int i = 0; i < 624; ++i) {
    uint32_t y = (state_[i] & kUpper) | (state_[(i + 1) % 624] & kLower);
    state_[i] = state_[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? kMatrix : 0u);
  }
  pos_ = 0;
}

uint32_t NumpyRandomState::next_uint32() {
  if (pos_ >= 624) generate();
  uint32_t y = state_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffull) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    // numpy's next_uint64 for MT19937: two draws, high word first.
    while ((value = (((static_cast<uint64_t>(next_uint32()) << 32) | next_uint32()) & mask)) >
           max) {
    }
  }
  return value;
}

}  // namespace loom::core
