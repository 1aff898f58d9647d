// Device helpers of the router kernels (moe_topk, moe_topk_bwd): one warp per row of E
// logits, the lanes striding over the experts (lane, lane + 32, ...), in f64 as the CPU
// reference (kernels/cpu/moe_topk.cc) computes, so that both rank the same scores. The
// logits are f32 or f64 (the router dtype): the helpers take either, and compute in f64.
//
// Sums. A sum over the row (softmax's denominator, the backward's dot products) is taken in
// index order, as the CPU's loop adds: each lane computes its element of a 32-wide slice and
// every lane adds the slice's 32 values one by one, broadcast by shuffles. So every lane
// holds the CPU's bits (up to the last bit of exp) without a tree's different rounding.
//
// Ranking. The selection orders (score, id) pairs by descending score, ties to the lower id.
// RankKey packs a pair so that its unsigned lexicographic order is exactly that order: the
// score's bits made monotone (negative doubles' bits flipped, positive ones' sign bit set),
// -0 folded onto +0 (they compare equal, so they tie) and every NaN onto one NaN above +inf
// (torch.topk's order; a NaN logit must still give K distinct valid ids), then the id
// complemented. Keys are distinct for distinct ids, so the k-th best pair is the largest key
// below the (k-1)-th: each pass is a lane-local max over the keys below the previous pick,
// then a warp max. Nothing is stored per expert, and the pick depends on the keys alone
// (the answer of a sort).
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/cuda/common/device_util.cuh"

namespace loom::kernels::cuda::moe {

inline constexpr int kRowWarps = 4;  // rows (warps) per block of the router kernels
inline constexpr int kRowThreads = 32 * kRowWarps;
// moe_topk keeps a warp's group scores in shared memory: 4 warps x 1024 doubles = 32 KiB.
// DeepSeek-V3 has 8 groups; `supports` declines more than this.
inline constexpr int kMaxGroups = 1024;
// Blocks of a router launch at most (the grid strides over more rows).
inline constexpr int64_t kMaxRowBlocks = 16384;

inline constexpr unsigned kFullMask = 0xffffffffu;

inline unsigned router_blocks(int64_t rows) {
  int64_t b = (rows + kRowWarps - 1) / kRowWarps;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxRowBlocks ? kMaxRowBlocks : b));
}

struct RankKey {
  unsigned long long score;  // monotone bits of the score
  uint32_t id;               // ~id: the lower id is the larger
};

// Below every key (no pick) and above every key (before the first pick).
__device__ __forceinline__ RankKey key_bottom() { return RankKey{0ull, 0u}; }
__device__ __forceinline__ RankKey key_top() { return RankKey{~0ull, ~0u}; }

__device__ __forceinline__ bool key_less(const RankKey& a, const RankKey& b) {
  return a.score < b.score || (a.score == b.score && a.id < b.id);
}

__device__ __forceinline__ RankKey rank_key(double score, int64_t id) {
  unsigned long long b = static_cast<unsigned long long>(__double_as_longlong(score));
  if (score == 0.0) b = 0ull;                   // -0 ties +0
  if (isnan(score)) b = 0x7ff8000000000000ull;  // any NaN ranks first
  constexpr unsigned long long kSign = 0x8000000000000000ull;
  b = (b & kSign) ? ~b : (b | kSign);
  return RankKey{b, ~static_cast<uint32_t>(id)};
}

__device__ __forceinline__ int32_t key_id(const RankKey& k) { return static_cast<int32_t>(~k.id); }

// The (canonical) score of a key.
__device__ __forceinline__ double key_score(const RankKey& k) {
  constexpr unsigned long long kSign = 0x8000000000000000ull;
  unsigned long long b = (k.score & kSign) ? (k.score & ~kSign) : ~k.score;
  return __longlong_as_double(static_cast<long long>(b));
}

__device__ __forceinline__ RankKey warp_max_key(RankKey v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    RankKey w{__shfl_xor_sync(kFullMask, v.score, o), __shfl_xor_sync(kFullMask, v.id, o)};
    if (key_less(v, w)) v = w;
  }
  return v;
}

// Updates `best` with key `k` when it ranks below `prev` and above `best`.
__device__ __forceinline__ void keep_best(RankKey& best, const RankKey& k, const RankKey& prev) {
  if (key_less(k, prev) && key_less(best, k)) best = k;
}

__device__ __forceinline__ double sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }

// The row's maximum logit (as f64: exact for f32 logits), every lane alike.
template <class T>
__device__ __forceinline__ double row_max(const T* __restrict__ l, int64_t e, int lane) {
  double m = -INFINITY;
  for (int64_t i = lane; i < e; i += 32) m = fmax(m, static_cast<double>(l[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(kFullMask, m, o));
  return m;
}

// sum over i in [0, e), in index order, of f(i); every lane of the warp gets the same bits.
template <class F>
__device__ __forceinline__ double ordered_row_sum(int64_t e, int lane, F&& f) {
  double sum = 0.0;
  for (int64_t base = 0; base < e; base += 32) {
    const double v = base + lane < e ? f(base + lane) : 0.0;
    const int n = e - base < 32 ? static_cast<int>(e - base) : 32;
    for (int j = 0; j < n; ++j) sum += __shfl_sync(kFullMask, v, j);
  }
  return sum;
}

// softmax(l)_i = exp(l_i - max) / sum, the CPU's softmax.
struct RowSoftmax {
  double max, sum;
  template <class T>
  __device__ __forceinline__ double at(const T* l, int64_t i) const {
    return exp(static_cast<double>(l[i]) - max) / sum;
  }
};

template <class T>
__device__ __forceinline__ RowSoftmax row_softmax(const T* __restrict__ l, int64_t e, int lane) {
  RowSoftmax s{row_max(l, e, lane), 1.0};
  const double m = s.max;
  s.sum = ordered_row_sum(e, lane, [&](int64_t i) { return exp(static_cast<double>(l[i]) - m); });
  return s;
}

}  // namespace loom::kernels::cuda::moe
