// Philox4x32-10 on the device: the same stream as kernels/cpu/philox.h (loom/ops.h,
// "Random numbers"), so that a dropout mask drawn on the GPU equals the CPU's bit for bit.
#pragma once

#include <stdint.h>

namespace loom::kernels::cuda {

struct Philox4 {
  uint32_t w[4];
};

// Ten rounds on counter (c0, c1, 0, 0) = (low, high half of `counter`) with the 64-bit key.
__host__ __device__ __forceinline__ Philox4 philox4x32_10(uint64_t key, uint64_t counter) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0u, c3 = 0u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Keep threshold: kept when (word >> 8) >= threshold, i.e. (word >> 8) * 2^-24 >= p
// (ceil(p * 2^24), computed on the host exactly as the CPU does).
inline uint32_t keep_threshold(float p) {
  double t = static_cast<double>(p) * 16777216.0;
  uint32_t u = static_cast<uint32_t>(t);
  return static_cast<double>(u) < t ? u + 1 : u;
}

// Whether element `index` of a call with (key, counter) survives dropout.
__device__ __forceinline__ bool philox_keep(uint64_t key, uint64_t counter, uint64_t index,
                                            uint32_t threshold) {
  Philox4 r = philox4x32_10(key, counter + index / 4);
  return (r.w[index % 4] >> 8) >= threshold;
}

}  // namespace loom::kernels::cuda
