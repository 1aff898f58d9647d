// swap_axes_12 (loom/ops.h): Y[a, j, i, d] = X[a, i, j, d], e.g. (B, T, H, D) <-> (B, H, T, D)
// for attention cores that work head-major; any dtype of 2 or 4 bytes (the bytes move
// unchanged).
//
// Algorithm: the D elements of (a, i, j) are contiguous in both X and Y, so each such row
// moves whole, in the widest unit (16, 8, 4 or 2 bytes) that divides the row's bytes and
// both addresses. For the head dims of attention (D = 64..256) a row is 128..512 bytes, so
// reads and writes are both coalesced and no shared-memory transpose is needed.
//
// Launch: one thread per unit of Y (consecutive threads write consecutive units), 256
// threads per block, grid-striding with 64-bit indices. Y must not alias X (checked).
#include <loom/cpp/op_checks/qkv.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

template <class U>
__global__ void swap_axes_kernel(const U* __restrict__ x, U* __restrict__ y, int64_t rows,
                                 int64_t per_row, int64_t ni, int64_t nj) {
  const int64_t n = rows * per_row;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = q / per_row, u = q - row * per_row;  // row of Y: (a, j, i)
    const int64_t i = row % ni, aj = row / ni;
    const int64_t j = aj % nj, a = aj / nj;
    y[q] = x[((a * ni + i) * nj + j) * per_row + u];
  }
}

void launch_swap_axes(const OpCall* call, const op_checks::SwapShape& s) {
  const int64_t rows = s.a * s.i * s.j;
  if (rows == 0 || s.d == 0) return;
  const TensorView &X = call->inputs[0], &Y = call->outputs[0];
  const int64_t row_bytes = s.d * static_cast<int64_t>(s.bytes);
  const int unit = copy_unit(row_bytes, {X.data, Y.data});
  const int64_t per_row = row_bytes / unit;
  LOOM_POINTWISE_UNIT_SWITCH(unit, U, {
    swap_axes_kernel<U>
        <<<grid_for(rows * per_row, kFlatThreads), kFlatThreads, 0, stream_of(call)>>>(
            static_cast<const U*>(X.data), static_cast<U*>(Y.data), rows, per_row, s.i, s.j);
  });
  launch_check(ops::kSwapAxes12);
}

op_checks::SwapShape check_swap(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_swap_axes(c, s, d);
}

Status swap_axes_12(const OpCall* call) {
  return guard([&] { launch_swap_axes(call, check_swap(call, false, DeviceType::kCuda)); });
}

LOOM_CUDA_HOOKS(swap_axes_12, check_swap, 0)

}  // namespace

void add_swap_axes_kernels(std::vector<KernelDesc>& out) {
  // Every dtype of 2 or 4 bytes: the op moves bytes.
  add_cuda_kernels(out, ops::kSwapAxes12, swap_axes_12, swap_axes_12_supports, swap_axes_12_cost,
                   {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI16, DType::kU16});
}

}  // namespace loom::kernels::cuda::pointwise
