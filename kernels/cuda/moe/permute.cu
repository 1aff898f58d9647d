// moe_permute (loom/ops/moe.h): Y[j] = X[src[j]] for the M rows of Y (N, C) -> (M, C), the
// dispatch of token rows to expert rows. X and Y share their dtype, so a row moves as raw
// bytes (any float dtype, bit-exact). A src outside [0, N) never addresses X: its row of Y
// is zeros and the index is reported lazily (index_errors.cuh).
//
// Launch: row_launch.cuh over the M rows of Y, a row cut into units of the widest of 16, 8,
// 4, 2 bytes that divides the row's bytes and both base addresses.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/moe.h>

#include <initializer_list>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/moe/index_errors.cuh"
#include "kernels/cuda/moe/registry.cuh"
#include "kernels/cuda/moe/row_launch.cuh"

namespace loom::kernels::cuda::moe {
namespace {

// Y (M, units) = X (N, units) rows src; U is one unit of a row's bytes.
template <class U>
__global__ void permute_kernel(const U* __restrict__ x, const int32_t* __restrict__ src,
                               U* __restrict__ y, int64_t n, int64_t m, int64_t units,
                               IndexErrorSink sink) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; j < m;
       j += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int32_t s = src[j];
    const bool ok = s >= 0 && s < n;
    if (!ok && threadIdx.x == 0) report_index_error(sink, IndexOp::kPermuteSrc, j, s, n);
    const U* from = x + (ok ? s : 0) * units;
    U* to = y + j * units;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) to[u] = ok ? from[u] : U{};
  }
}

// The widest unit (bytes) that divides `row_bytes` and every address in `ptrs`.
int unit_bytes(int64_t row_bytes, std::initializer_list<const void*> ptrs) {
  for (int unit : {16, 8, 4}) {
    bool ok = row_bytes % unit == 0;
    for (const void* p : ptrs) ok = ok && is_aligned(p, static_cast<uintptr_t>(unit));
    if (ok) return unit;
  }
  return 2;  // every float dtype is at least 2 bytes
}

template <class U>
void launch(const TensorView& X, const int32_t* src, const TensorView& Y,
            const op_checks::MoePermuteShape& s, int64_t units, IndexErrorSink sink,
            cudaStream_t stream) {
  RowLaunch g = row_launch(s.m, units);
  permute_kernel<U><<<g.grid, g.block, 0, stream>>>(static_cast<const U*>(X.data), src,
                                                    static_cast<U*>(Y.data), s.n, s.m, units, sink);
}

op_checks::MoePermuteShape check(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_permute(call, shapes_only, DeviceType::kCuda);
}

Status moe_permute(const OpCall* call) {
  return guard([&] {
    op_checks::MoePermuteShape s = check(call, false);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    const int device = current_device(ops::kMoePermute, Y);
    cudaStream_t stream = stream_of(call);
    IndexErrorSink sink = index_error_sink(device, stream);  // fails for an earlier error
    // With C == 0 the indices are still checked.
    if (s.m == 0) return;
    const int64_t row_bytes = s.c * static_cast<int64_t>(dtype_size(X.dtype));
    const int unit = s.c == 0 ? 16 : unit_bytes(row_bytes, {X.data, Y.data});
    const int64_t units = row_bytes / unit;
    const int32_t* src = static_cast<const int32_t*>(call->inputs[1].data);
    switch (unit) {
      case 16:
        launch<uint4>(X, src, Y, s, units, sink, stream);
        break;
      case 8:
        launch<uint2>(X, src, Y, s, units, sink, stream);
        break;
      case 4:
        launch<uint32_t>(X, src, Y, s, units, sink, stream);
        break;
      default:
        launch<uint16_t>(X, src, Y, s, units, sink, stream);
        break;
    }
    launch_check(ops::kMoePermute);
  });
}

bool moe_permute_supports(const OpCall* call) {
  return check_passes([&] { check(call, true); });
}

Status moe_permute_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    check(call, true);
    *out = io_cost(call, static_cast<double>(max_numel(call)));  // the CPU kernel's cost
  });
}

}  // namespace

void add_permute_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kMoePermute, moe_permute, moe_permute_supports, moe_permute_cost);
}

}  // namespace loom::kernels::cuda::moe
