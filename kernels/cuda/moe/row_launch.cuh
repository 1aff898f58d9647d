// The launch geometry of the moe kernels that move whole rows (permute, unpermute): 2-D
// blocks of 256 threads, threadIdx.x across a row's `units` (a power of two in [32, 256]
// threads that leaves each about 4 units), threadIdx.y over rows; the grid strides over the
// rows, so a block of rows loops with 64-bit offsets past the last block.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace loom::kernels::cuda::moe {

struct RowLaunch {
  unsigned grid;
  dim3 block;
};

inline RowLaunch row_launch(int64_t rows, int64_t units) {
  unsigned tx = 32;
  while (tx < 256 && tx * 4 < units) tx *= 2;
  dim3 block(tx, 256 / tx);
  int64_t blocks = (rows + block.y - 1) / block.y;
  // 65535 blocks of 256 threads fill any current GPU many times over; more rows loop.
  return RowLaunch{static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks)),
                   block};
}

}  // namespace loom::kernels::cuda::moe
