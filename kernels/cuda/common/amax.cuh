// The NaN-propagating max |x| of the "amax" op (loom/ops.h), shared by the kernels that
// accumulate one into an f32 in device memory (elementwise/reductions.cu's amax, pointwise's
// fp8_quantize).
//
// The bit patterns of non-negative floats order as the floats do, and every NaN's lies
// above +inf's, so an unsigned max over the bits of |x| is a max that propagates NaN (exact
// and independent of the order of the elements). Each thread keeps such a max in a register;
// the block reduces them, and one thread folds the block's max into out[0] by an atomicCAS
// loop with a NaN-propagating float max (not atomicMax on the bits: out[0] may hold a
// negative value or a NaN with the sign bit set, whose unsigned bits order wrongly).
#pragma once

#include <stdint.h>

namespace loom::kernels::cuda {

/// The bits of |v|: 0 for +-0, 0x7f800000 for +-inf, above that for NaN.
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

/// max(a, b) where a NaN on either side wins.
__device__ __forceinline__ float nan_max(float a, float b) { return a > b || isnan(a) ? a : b; }

/// out[0] = nan_max(out[0], the float of the largest `bits` of the block's threads).
/// Every thread of the block must call it, with blockDim.x a multiple of 32 and at most 1024;
/// it ends the threads' use of shared memory (no barrier after it), so call it last.
__device__ __forceinline__ void block_amax_fold(uint32_t bits, float* out) {
  __shared__ uint32_t partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  bits = __reduce_max_sync(0xffffffffu, bits);
  if (lane == 0) partial[warp] = bits;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) bits = max(bits, partial[w]);
  const float block_amax = __uint_as_float(bits);
  unsigned int* word = reinterpret_cast<unsigned int*>(out);
  unsigned int old = *reinterpret_cast<volatile unsigned int*>(word);
  while (true) {
    const unsigned int want = __float_as_uint(nan_max(__uint_as_float(old), block_amax));
    if (want == old) break;
    const unsigned int seen = atomicCAS(word, old, want);
    if (seen == old) break;
    old = seen;
  }
}

}  // namespace loom::kernels::cuda
