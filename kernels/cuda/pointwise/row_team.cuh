// Row kernels (norms, softmax): a *team* of threads handles one row of a (rows, cols)
// tensor and keeps the row in registers between its passes (statistics, then output), so
// that each element is read from memory once.
//
// Geometry: the row is cut into chunks of 4 elements; team lane l holds chunks l, l + tpr,
// l + 2 tpr, ... The team size tpr is the power of two in [32, 512] that leaves at most
// kChunks chunks per lane, so a row of up to kChunks * 4 * 512 elements lives in registers;
// the chunks of longer rows past that are re-read from memory (L2) in each pass (a team of
// 512 always has its block to itself). A block
// holds max(tpr, 256) / tpr teams (rows at a time), so that short rows still make blocks of
// 256 threads; the grid strides over the rows, every team of a block stepping together so
// that __syncthreads stays uniform (a team past the last row takes part with zeros).
//
// Team reductions: a butterfly within each warp (every lane ends with the same bits), then,
// for teams wider than a warp, the warp totals through shared memory summed in warp order:
// deterministic for a given geometry.
#pragma once

#include <algorithm>

#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {

struct RowGeometry {
  int tpr;        // threads per row (team size): a power of two in [32, kMaxTeam]
  int teams;      // rows per block
  int block;      // threads per block, tpr * teams
  unsigned grid;  // blocks
};

// Largest team: blocks of at most 512 threads leave each thread 128 registers, which the
// register-cached rows need (a 1024-thread block would squeeze them into 64).
inline constexpr int kMaxTeam = 512;

// The geometry for `rows` rows of `cols` elements with `chunks_per_lane` chunks per lane in
// registers, at most `max_blocks` blocks.
inline RowGeometry row_geometry(int64_t rows, int64_t cols, int chunks_per_lane,
                                int64_t max_blocks) {
  int64_t chunks = (cols + 3) / 4;
  int64_t want = (chunks + chunks_per_lane - 1) / chunks_per_lane;
  int tpr = 32;
  while (tpr < want && tpr < kMaxTeam) tpr *= 2;
  RowGeometry g;
  g.tpr = tpr;
  g.block = std::max(tpr, 256);
  g.teams = g.block / tpr;
  int64_t blocks = (rows + g.teams - 1) / g.teams;
  g.grid = static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, max_blocks));
  return g;
}

// Calls f(k, c) for every chunk of lane `lane` in a row of `cols` elements: k is the
// register slot (0 <= k < kChunks, a compile-time constant once unrolled) or -1 for a chunk
// past the register capacity, c the chunk's first element.
template <int kChunks, class F>
__device__ __forceinline__ void for_each_chunk(int lane, int tpr, int64_t cols, F&& f) {
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    int64_t c = (static_cast<int64_t>(k) * tpr + lane) * 4;
    if (c < cols) f(k, c);
  }
  for (int64_t c = (static_cast<int64_t>(kChunks) * tpr + lane) * 4; c < cols;
       c += static_cast<int64_t>(tpr) * 4)
    f(-1, c);
}

// Shared memory of team_sum / team_max: one float per warp and value.
template <int kValues>
struct TeamScratch {
  float v[32][kValues];
};

// Sums each of v[0..kValues) over the team; every lane of the team gets the totals. Called
// by every thread of the block (uniformly).
template <int kValues>
__device__ __forceinline__ void team_sum(float (&v)[kValues], int tpr,
                                         TeamScratch<kValues>& scratch) {
#pragma unroll
  for (int j = 0; j < kValues; ++j) v[j] = warp_sum(v[j]);
  if (tpr <= 32) return;
  int warp = threadIdx.x / 32, per_team = tpr / 32, first = warp / per_team * per_team;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int j = 0; j < kValues; ++j) scratch.v[warp][j] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kValues; ++j) {
    float s = 0.0f;
    for (int w = 0; w < per_team; ++w) s += scratch.v[first + w][j];
    v[j] = s;
  }
  __syncthreads();  // the scratch is reused by the next reduction
}

// The maximum of v over the team, as team_sum.
__device__ __forceinline__ float team_max(float v, int tpr, TeamScratch<1>& scratch) {
  v = warp_max(v);
  if (tpr <= 32) return v;
  int warp = threadIdx.x / 32, per_team = tpr / 32, first = warp / per_team * per_team;
  if (threadIdx.x % 32 == 0) scratch.v[warp][0] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < per_team; ++w) m = fmaxf(m, scratch.v[first + w][0]);
  __syncthreads();
  return m;
}

}  // namespace loom::kernels::cuda::pointwise
