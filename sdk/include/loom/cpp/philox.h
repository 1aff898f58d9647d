// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of loom's dropout (loom/ops.h, "Random numbers"). One header for
// host C++ (g++, clang++) and CUDA device code (nvcc), so that every kernel library draws the
// same mask for the same (key, counter) bit for bit. Header-only.
//
// Convention, identical on every device:
// - the 64-bit key splits into two 32-bit words: k0 = low half, k1 = high half;
// - the 128-bit counter of block j is (c0, c1, c2, c3) = (low half of counter + j, high
//   half of counter + j, 0, 0), counter + j taken modulo 2^64;
// - ten rounds, the key bumped by the Weyl constants between rounds; the output is the
//   four words (x0, x1, x2, x3) after the tenth round.
// Element i of a call uses word i % 4 of block i / 4 and is kept when
// (word >> 8) * 2^-24 >= p (a 24-bit uniform in [0, 1)).
#pragma once

#include <stdint.h>

#include "loom/cpp/host_device.h"

namespace loom {

/// One Philox4x32 block: four 32-bit words (a counter going in, random words coming out).
struct Philox4 {
  uint32_t w[4];
};

/// Philox4x32-10 on a full 128-bit counter and 64-bit key (checked against the published
/// known-answer vectors of Random123 in tests/kernels/cpu/dropout_test.cc).
/// \param ctr  the counter (c0, c1, c2, c3)
/// \param k0   low 32 bits of the key
/// \param k1   high 32 bits of the key
/// \return     the four output words (x0, x1, x2, x3)
LOOM_HOST_DEVICE LOOM_FORCEINLINE Philox4 philox4x32_10_block(Philox4 ctr, uint32_t k0,
                                                              uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = ctr.w[0], c1 = ctr.w[1], c2 = ctr.w[2], c3 = ctr.w[3];
#ifdef __CUDA_ARCH__  // the device pass only: the host compiler does not know the pragma
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;  // unsigned: wraps by definition
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

/// loom's use of the generator: the 64-bit key and a 64-bit block counter, upper counter
/// words 0 (the convention above).
/// \param key      the call's 64-bit key (k0 its low half, k1 its high half)
/// \param counter  the block's counter: the call's counter plus the block index (mod 2^64)
/// \return         the block's four random words
LOOM_HOST_DEVICE LOOM_FORCEINLINE Philox4 philox4x32_10(uint64_t key, uint64_t counter) {
  Philox4 ctr{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}};
  return philox4x32_10_block(ctr, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

/// The keep threshold of dropout probability `p`: an element is kept when
/// (word >> 8) >= threshold, i.e. (word >> 8) * 2^-24 >= p. Computed in f64 (exact), once per
/// call on the host by the kernels, which pass it to the device.
/// \param p  the probability of dropping an element, in [0, 1)
/// \return   ceil(p * 2^24): the smallest 24-bit integer u with u * 2^-24 >= p
LOOM_HOST_DEVICE inline uint32_t keep_threshold(float p) {
  double t = static_cast<double>(p) * 16777216.0;
  uint32_t u = static_cast<uint32_t>(t);
  return static_cast<double>(u) < t ? u + 1 : u;
}

/// Whether element `index` of a call with (key, counter) survives dropout.
/// \param key        the call's 64-bit key
/// \param counter    the call's first block counter
/// \param index      the element's index in the call (word index % 4 of block index / 4)
/// \param threshold  keep_threshold of the call's dropout probability
LOOM_HOST_DEVICE LOOM_FORCEINLINE bool philox_keep(uint64_t key, uint64_t counter, uint64_t index,
                                                   uint32_t threshold) {
  Philox4 r = philox4x32_10(key, counter + index / 4);
  return (r.w[index % 4] >> 8) >= threshold;
}

/// keep[j] = philox_keep(key, counter, start + j, threshold) for j < n, drawing one Philox
/// block per 4 elements (not one per element).
/// \param key        the call's 64-bit key
/// \param counter    the call's first block counter
/// \param start      index of the first element in the call
/// \param n          number of elements (none when n <= 0)
/// \param threshold  keep_threshold of the call's dropout probability
/// \param keep       (n) out: 1 for a kept element, 0 for a dropped one
LOOM_HOST_DEVICE inline void philox_keep_range(uint64_t key, uint64_t counter, uint64_t start,
                                               int64_t n, uint32_t threshold, uint8_t* keep) {
  int64_t j = 0;
  while (j < n) {
    uint64_t index = start + static_cast<uint64_t>(j);
    Philox4 r = philox4x32_10(key, counter + index / 4);
    for (uint64_t w = index % 4; w < 4 && j < n; ++w, ++j) keep[j] = (r.w[w] >> 8) >= threshold;
  }
}

}  // namespace loom
