// fp8_quantize (loom/ops.h): Y = fp8(X * scale[0]) and its transpose Yt, each optional, and
// amax[0] = max(amax[0], max |X|) (of X before scaling, NaN propagating), for X (M, K) in any
// float dtype and Y / Yt in E4M3 or E5M2.
//
// Conversion: the f32 product X * scale[0], then loom/cpp/fp8.h's f32_to_fp8 bit for bit.
// cvt.rn.satfinite (cuda_fp8.h's __nv_cvt_float_to_fp8 with __NV_SATFINITE, sm_89+) rounds
// to nearest even and saturates; the input is clamped to +-max first so that infinities
// saturate whatever the instruction does with them, and NaN is encoded by hand: the
// instruction writes one canonical NaN (0x7f), f32_to_fp8 keeps the sign (S.1111.111 for
// E4M3, S.11111.10 for E5M2). The GPU's multiply already returns its canonical (positive)
// NaN, so a NaN in X gives the positive NaN code, where a CPU that propagates the operand's
// NaN may give the negative one: both are NaN.
//
// Without Yt, one flat pass: a thread per chunk of 4 elements (a 16- or 8-byte load, a
// 4-byte store when X and Y are aligned), grid-striding with 64-bit indices over at most
// 1024 blocks (about one wave of an H100, which saturates memory; it also bounds the amax
// atomics of a call).
//
// With Yt, one read of X writes both outputs: each of at most 1024 blocks takes 64 x 64 tiles
// of X in turn. Phase 1 reads the tile by rows (16 threads per row, 4 elements each,
// coalesced), writes Y's codes straight to global memory and puts them in shared memory
// already transposed, tile[k][m]; phase 2 writes Yt's 64 rows of the tile, 16 codes (one
// 16-byte store when M is a multiple of 16 and Yt aligned) per thread. A shared row is 68
// bytes: the column writes of phase 1 and the word reads of phase 2 then meet at most 2-way
// bank conflicts.
//
// amax: each thread keeps an unsigned max over the bits of |x| over everything it read; the
// block folds it into amax[0] once, at the end (kernels/cuda/common/amax.cuh, the same as the
// "amax" op).
#include <cuda_fp8.h>
#include <loom/cpp/op_checks/fp8.h>

#include "kernels/cuda/common/amax.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

constexpr int kTile = 64;                // rows (M) and columns (K) of X per tile
constexpr int kTileThreads = 4 * kTile;  // phase 2: 4 threads per row of Yt's tile
constexpr int kTileStride = kTile + 4;   // bytes per shared row (see the file comment)
constexpr int kChunksPerRow = kTile / 4;
constexpr int64_t kMaxBlocks = 1024;  // per launch (see the file comment)

// The code of `v` in E5M2 (kE5M2) or E4M3, exactly as loom's f32_to_fp8.
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8_code(float v) {
  constexpr float kMax = kE5M2 ? 57344.0f : 448.0f;
  if (isnan(v)) return ((__float_as_uint(v) >> 24) & 0x80u) | (kE5M2 ? 0x7eu : 0x7fu);
  return __nv_cvt_float_to_fp8(fminf(fmaxf(v, -kMax), kMax), __NV_SATFINITE,
                               kE5M2 ? __NV_E5M2 : __NV_E4M3);
}

// Codes of the 4 values v * s in code[], and their |v| into `bits`.
template <bool kE5M2>
__device__ __forceinline__ void quantize4(const float (&v)[4], float s, uint32_t (&code)[4],
                                          uint32_t& bits) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    bits = max(bits, abs_bits(v[e]));
    code[e] = fp8_code<kE5M2>(v[e] * s);
  }
}

// Stores the codes of elements i .. i + 3 below `end` at p + i; one 4-byte store when `vec`
// (p aligned to 4 bytes, i a multiple of 4) and the chunk is whole.
__device__ __forceinline__ void store_codes(uint8_t* p, int64_t i, int64_t end, bool vec,
                                            const uint32_t (&code)[4]) {
  if (vec && i + 4 <= end) {
    *reinterpret_cast<uint32_t*>(p + i) = code[0] | code[1] << 8 | code[2] << 16 | code[3] << 24;
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (i + e < end) p[i + e] = static_cast<uint8_t>(code[e]);
}

// Y only: X and Y flat, n elements. amax may be null.
template <bool kE5M2>
__global__ void quantize_kernel(const void* __restrict__ x, DType xt,
                                const float* __restrict__ scale, uint8_t* __restrict__ y,
                                float* __restrict__ amax, int64_t n, bool vec) {
  const float s = *scale;
  uint32_t bits = 0u;
  const int64_t chunks = (n + 3) / 4;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < chunks;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = q * 4;
    float v[4];
    uint32_t code[4];
    load4(x, xt, i, n, vec, v);  // past n: zeros, which leave bits unchanged
    quantize4<kE5M2>(v, s, code, bits);
    store_codes(y, i, n, vec, code);
  }
  if (amax != nullptr) block_amax_fold(bits, amax);
}

// X (M, K) -> Yt (K, M) and, when y is not null, Y (M, K); amax may be null. vec_x: X aligned
// to 4 elements and K % 4 == 0; vec_y: Y aligned to 4 bytes and K % 4 == 0; vec_yt: Yt
// aligned to 16 bytes and M % 16 == 0.
template <bool kE5M2>
__global__ void __launch_bounds__(kTileThreads)
    quantize_transpose_kernel(const void* __restrict__ x, DType xt, const float* __restrict__ scale,
                              uint8_t* __restrict__ y, uint8_t* __restrict__ yt,
                              float* __restrict__ amax, int64_t m, int64_t k, bool vec_x,
                              bool vec_y, bool vec_yt) {
  // tile[c * kTileStride + r]: the code of X[m0 + r, k0 + c].
  __shared__ __align__(16) uint8_t tile[kTile * kTileStride];
  const float s = *scale;
  const int64_t tiles_k = (k + kTile - 1) / kTile;
  const int64_t tiles = tiles_k * ((m + kTile - 1) / kTile);
  uint32_t bits = 0u;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t m0 = (t / tiles_k) * kTile, k0 = (t % tiles_k) * kTile;
    // Phase 1: rows of X -> Y and the transposed tile.
    for (int c = threadIdx.x; c < kTile * kChunksPerRow; c += kTileThreads) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 4;
      const int64_t row = m0 + r, kc = k0 + col;
      uint32_t code[4] = {0u, 0u, 0u, 0u};
      if (row < m && kc < k) {
        const int64_t i = row * k + kc, row_end = row * k + k;
        float v[4];
        load4(x, xt, i, row_end, vec_x, v);
        quantize4<kE5M2>(v, s, code, bits);
        if (y != nullptr) store_codes(y, i, row_end, vec_y, code);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) tile[(col + e) * kTileStride + r] = static_cast<uint8_t>(code[e]);
    }
    __syncthreads();
    // Phase 2: row k0 + c of Yt, columns m0 + 16 p .. m0 + 16 p + 15.
    const int c = threadIdx.x / 4, p = threadIdx.x % 4;
    const int64_t kr = k0 + c, mc = m0 + p * 16;
    if (kr < k && mc < m) {
      const uint8_t* src = tile + c * kTileStride + p * 16;
      uint8_t* dst = yt + kr * m + mc;
      if (vec_yt && mc + 16 <= m) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(src);
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        for (int e = 0; e < 16 && mc + e < m; ++e) dst[e] = src[e];
      }
    }
    __syncthreads();  // the next tile overwrites `tile`
  }
  if (amax != nullptr) block_amax_fold(bits, amax);
}

template <bool kE5M2>
void launch(const OpCall* call, const op_checks::Fp8QuantizeShape& s) {
  const TensorView& X = call->inputs[0];
  const float* scale = static_cast<const float*>(call->inputs[1].data);
  uint8_t* y = s.y ? static_cast<uint8_t*>(call->outputs[0].data) : nullptr;
  uint8_t* yt = s.yt ? static_cast<uint8_t*>(call->outputs[1].data) : nullptr;
  float* amax = s.amax ? static_cast<float*>(call->outputs[2].data) : nullptr;
  const cudaStream_t stream = stream_of(call);
  const int64_t n = s.m * s.k;
  if (yt == nullptr) {
    const bool vec = aligned4(X) && reinterpret_cast<uintptr_t>(y) % 4 == 0;
    const int64_t chunks = (n + 3) / 4;
    const unsigned blocks =
        static_cast<unsigned>(std::min((chunks + kFlatThreads - 1) / kFlatThreads, kMaxBlocks));
    quantize_kernel<kE5M2>
        <<<blocks, kFlatThreads, 0, stream>>>(X.data, X.dtype, scale, y, amax, n, vec);
    return;
  }
  static_assert(kTile * kChunksPerRow % kTileThreads == 0 && kTileThreads == 4 * kTile);
  const bool vec_x = aligned4(X) && s.k % 4 == 0;
  const bool vec_y = reinterpret_cast<uintptr_t>(y) % 4 == 0 && s.k % 4 == 0;
  const bool vec_yt = reinterpret_cast<uintptr_t>(yt) % 16 == 0 && s.m % 16 == 0;
  const int64_t tiles = ((s.m + kTile - 1) / kTile) * ((s.k + kTile - 1) / kTile);
  const unsigned blocks = static_cast<unsigned>(std::min(tiles, kMaxBlocks));
  quantize_transpose_kernel<kE5M2><<<blocks, kTileThreads, 0, stream>>>(
      X.data, X.dtype, scale, y, yt, amax, s.m, s.k, vec_x, vec_y, vec_yt);
}

Status fp8_quantize(const OpCall* call) {
  return guard([&] {
    const op_checks::Fp8QuantizeShape s =
        op_checks::check_fp8_quantize(call, false, DeviceType::kCuda);
    if (s.m * s.k == 0) return;  // nothing to write; amax[0] unchanged
    if (s.out_dtype == DType::kF8E5M2)
      launch<true>(call, s);
    else
      launch<false>(call, s);
    launch_check(ops::kFp8Quantize);
  });
}

// One multiply and one compare per element.
LOOM_CUDA_HOOKS(fp8_quantize, op_checks::check_fp8_quantize, 2)

}  // namespace

void add_fp8_quantize_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kFp8Quantize, fp8_quantize, fp8_quantize_supports, fp8_quantize_cost);
}

}  // namespace loom::kernels::cuda::pointwise
