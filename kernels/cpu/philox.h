// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of loom's dropout (loom/ops.h, "Random numbers").
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

namespace loom::kernels::cpu {

struct Philox4 {
  uint32_t w[4];
};

// The generator on a full 128-bit counter and 64-bit key (checked against the published
// known-answer vectors of Random123 in the tests).
inline Philox4 philox4x32_10_block(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = ctr.w[0], c1 = ctr.w[1], c2 = ctr.w[2], c3 = ctr.w[3];
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

// loom's use: the 64-bit key and the 64-bit block counter, upper counter words 0.
inline Philox4 philox4x32_10(uint64_t key, uint64_t counter) {
  Philox4 ctr{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}};
  return philox4x32_10_block(ctr, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

// Keep threshold: element kept when (word >> 8) >= threshold, i.e. (word >> 8) * 2^-24 >= p.
inline uint32_t keep_threshold(float p) {
  // ceil(p * 2^24): the smallest 24-bit integer u with u * 2^-24 >= p (exact in double).
  double t = static_cast<double>(p) * 16777216.0;
  uint32_t u = static_cast<uint32_t>(t);
  return static_cast<double>(u) < t ? u + 1 : u;
}

// Whether element `index` of a call with (key, counter) survives dropout.
inline bool philox_keep(uint64_t key, uint64_t counter, uint64_t index, uint32_t threshold) {
  Philox4 r = philox4x32_10(key, counter + index / 4);
  return (r.w[index % 4] >> 8) >= threshold;
}

// keep[j] = philox_keep(key, counter, start + j) for j < n, one Philox block per 4 elements.
inline void philox_keep_range(uint64_t key, uint64_t counter, uint64_t start, int64_t n,
                              uint32_t threshold, uint8_t* keep) {
  int64_t j = 0;
  while (j < n) {
    uint64_t index = start + static_cast<uint64_t>(j);
    Philox4 r = philox4x32_10(key, counter + index / 4);
    for (uint64_t w = index % 4; w < 4 && j < n; ++w, ++j) keep[j] = (r.w[w] >> 8) >= threshold;
  }
}

}  // namespace loom::kernels::cpu
