// dropout_fwd / dropout_bwd (loom/ops.h): Y = X * keep / (1 - p), keep drawn from
// Philox4x32-10 at (key, counter): element i keeps when word i % 4 of the block at
// counter + i / 4, shifted right by 8, is >= ceil(p * 2^24). Backward redraws the same mask
// (same key and counter), so nothing is stored between the passes.
//
// Algorithm: the Philox of loom/cpp/philox.h, the very code the CPU kernels run, and the keep
// test, the f32 scale 1 / (1 - p) and the product x * scale are the CPU's too: the mask, and
// the outputs, equal the CPU's bit for bit.
//
// Launch: one thread per Philox block, i.e. per 4 elements (one 16- or 8-byte access when
// both tensors are aligned; the tail block of N % 4 elements element by element), 256
// threads per block, grid-striding with 64-bit indices. Y may alias X: each thread reads its
// 4 elements before writing them.
#include <loom/cpp/op_checks/dropout.h>
#include <loom/cpp/philox.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

__global__ void dropout_kernel(const void* x, DType xt, void* y, DType yt, int64_t n, uint64_t key,
                               uint64_t counter, uint32_t threshold, float scale, bool vec) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < blocks;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Philox4 r = philox4x32_10(key, counter + static_cast<uint64_t>(q));
    float v[4];
    load4(x, xt, q * 4, n, vec, v);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = (r.w[e] >> 8) >= threshold ? v[e] * scale : 0.0f;
    store4(y, yt, q * 4, n, vec, v);
  }
}

void launch_dropout(const OpCall* call, int64_t n, const char* op) {
  if (n == 0) return;
  const ops::DropoutAttrs& at = *static_cast<const ops::DropoutAttrs*>(call->attrs);
  const TensorView &x = call->inputs[0], &y = call->outputs[0];
  const uint32_t threshold = keep_threshold(at.p);
  const float scale = 1.0f / (1.0f - at.p);
  dropout_kernel<<<grid_for((n + 3) / 4, kFlatThreads), kFlatThreads, 0, stream_of(call)>>>(
      x.data, x.dtype, y.data, y.dtype, n, at.key, at.counter, threshold, scale,
      aligned4(x) && aligned4(y));
  launch_check(op);
}

int64_t check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_dropout_fwd(c, s, d);
}
int64_t check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_dropout_bwd(c, s, d);
}

Status dropout_fwd(const OpCall* call) {
  return guard(
      [&] { launch_dropout(call, check_fwd(call, false, DeviceType::kCuda), ops::kDropoutFwd); });
}

Status dropout_bwd(const OpCall* call) {
  return guard(
      [&] { launch_dropout(call, check_bwd(call, false, DeviceType::kCuda), ops::kDropoutBwd); });
}

LOOM_CUDA_HOOKS(dropout_fwd, check_fwd, 2)
LOOM_CUDA_HOOKS(dropout_bwd, check_bwd, 2)

}  // namespace

void add_dropout_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kDropoutFwd, dropout_fwd, dropout_fwd_supports, dropout_fwd_cost);
  add_cuda_kernels(out, ops::kDropoutBwd, dropout_bwd, dropout_bwd_supports, dropout_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise
