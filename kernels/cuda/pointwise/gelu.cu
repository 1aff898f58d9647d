// gelu_fwd / gelu_bwd (loom/ops.h): Y = gelu(X), exact (x * Phi(x), erf) or the tanh
// approximation; dX = dY * gelu'(X). The arithmetic, elementwise in f32: gelu_math.cuh.
//
// Launch: one thread per chunk of 4 elements (one 16- or 8-byte access when every tensor is
// aligned), 256 threads per block, grid-striding with 64-bit indices over any N.
#include <loom/cpp/op_checks/activations.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/gelu_math.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

// dy == null: y = gelu(x); else y = dy * gelu'(x). n elements; y may be x's memory.
__global__ void gelu_kernel(const void* x, DType xt, const void* dy, DType dyt, void* y, DType yt,
                            int64_t n, bool tanh_approx, bool vec) {
  const int64_t chunks = (n + 3) / 4;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < chunks;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = q * 4;
    float v[4], g[4];
    load4(x, xt, i, n, vec, v);
    if (dy != nullptr) load4(dy, dyt, i, n, vec, g);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float d;
      float r = gelu(v[e], tanh_approx, dy != nullptr ? &d : nullptr);
      v[e] = dy != nullptr ? g[e] * d : r;
    }
    store4(y, yt, i, n, vec, v);
  }
}

void launch_gelu(const OpCall* call, int64_t n, bool bwd, const char* op) {
  if (n == 0) return;
  bool approx = static_cast<const ops::GeluAttrs*>(call->attrs)->approximate != 0;
  const TensorView& x = call->inputs[bwd ? 1 : 0];
  const TensorView* dy = bwd ? &call->inputs[0] : nullptr;
  const TensorView& y = call->outputs[0];
  bool vec = aligned4(x) && aligned4(y) && (dy == nullptr || aligned4(*dy));
  gelu_kernel<<<grid_for((n + 3) / 4, kFlatThreads), kFlatThreads, 0, stream_of(call)>>>(
      x.data, x.dtype, dy ? dy->data : nullptr, dy ? dy->dtype : DType::kF32, y.data, y.dtype, n,
      approx, vec);
  launch_check(op);
}

int64_t check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_gelu_fwd(c, s, d);
}
int64_t check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_gelu_bwd(c, s, d);
}

Status gelu_fwd(const OpCall* call) {
  return guard(
      [&] { launch_gelu(call, check_fwd(call, false, DeviceType::kCuda), false, ops::kGeluFwd); });
}

Status gelu_bwd(const OpCall* call) {
  return guard(
      [&] { launch_gelu(call, check_bwd(call, false, DeviceType::kCuda), true, ops::kGeluBwd); });
}

LOOM_CUDA_HOOKS(gelu_fwd, check_fwd, 20)
LOOM_CUDA_HOOKS(gelu_bwd, check_bwd, 30)

}  // namespace

void add_gelu_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kGeluFwd, gelu_fwd, gelu_fwd_supports, gelu_fwd_cost);
  add_cuda_kernels(out, ops::kGeluBwd, gelu_bwd, gelu_bwd_supports, gelu_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise
