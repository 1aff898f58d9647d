// swiglu_fwd / swiglu_bwd (loom/ops.h), Megatron's fused layout: X (N, 2F) holds the gate
// g = X[:, :F] then the up projection u = X[:, F:];
//   Y = silu(g) * u, silu(g) = g * sigmoid(g);
//   dg = dY * u * s * (1 + g (1 - s)), du = dY * g * s, s = sigmoid(g).
//
// Algorithm: elementwise in f32; sigmoid as 1 / (1 + exp(-g)), which tends to 0 and 1
// without NaN.
//
// Launch: one thread per chunk of 4 consecutive j of one row of Y (N, F): the chunk's gate,
// up and output are each one 16- or 8-byte access when F is a multiple of 4 and the tensors
// are aligned, else element by element within the row. 256 threads per block, grid-striding
// with 64-bit indices over N * ceil(F / 4) chunks.
#include <loom/cpp/op_checks/activations.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

// Forward when dy is null (out = Y (N, F)), else backward (out = dX (N, 2F)).
__global__ void swiglu_kernel(const void* x, DType xt, const void* dy, DType dyt, void* out,
                              DType ot, int64_t rows, int64_t f, bool vec) {
  const int64_t per_row = (f + 3) / 4, chunks = rows * per_row;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < chunks;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = q / per_row, j = (q - n * per_row) * 4;
    const int64_t gate = n * 2 * f, up = gate + f;  // first element of each half of row n
    float g[4], u[4];
    load4(x, xt, gate + j, gate + f, vec, g);
    load4(x, xt, up + j, up + f, vec, u);
    if (dy == nullptr) {
#pragma unroll
      for (int e = 0; e < 4; ++e) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
      store4(out, ot, n * f + j, (n + 1) * f, vec, g);
    } else {
      float d[4];
      load4(dy, dyt, n * f + j, (n + 1) * f, vec, d);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = 1.0f / (1.0f + expf(-g[e]));
        float dgate = d[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
        u[e] = d[e] * g[e] * s;
        g[e] = dgate;
      }
      store4(out, ot, gate + j, gate + f, vec, g);
      store4(out, ot, up + j, up + f, vec, u);
    }
  }
}

void launch_swiglu(const OpCall* call, op_checks::SwigluShape s, bool bwd, const char* op) {
  if (s.n == 0 || s.f == 0) return;
  const TensorView& x = call->inputs[bwd ? 1 : 0];
  const TensorView* dy = bwd ? &call->inputs[0] : nullptr;
  const TensorView& out = call->outputs[0];
  bool vec = s.f % 4 == 0 && aligned4(x) && aligned4(out) && (dy == nullptr || aligned4(*dy));
  int64_t chunks = s.n * ((s.f + 3) / 4);
  swiglu_kernel<<<grid_for(chunks, kFlatThreads), kFlatThreads, 0, stream_of(call)>>>(
      x.data, x.dtype, dy ? dy->data : nullptr, dy ? dy->dtype : DType::kF32, out.data, out.dtype,
      s.n, s.f, vec);
  launch_check(op);
}

op_checks::SwigluShape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_swiglu_fwd(c, s, d);
}
op_checks::SwigluShape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_swiglu_bwd(c, s, d);
}

Status swiglu_fwd(const OpCall* call) {
  return guard([&] {
    launch_swiglu(call, check_fwd(call, false, DeviceType::kCuda), false, ops::kSwigluFwd);
  });
}

Status swiglu_bwd(const OpCall* call) {
  return guard([&] {
    launch_swiglu(call, check_bwd(call, false, DeviceType::kCuda), true, ops::kSwigluBwd);
  });
}

LOOM_CUDA_HOOKS(swiglu_fwd, check_fwd, 8)
LOOM_CUDA_HOOKS(swiglu_bwd, check_bwd, 8)

}  // namespace

void add_swiglu_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kSwigluFwd, swiglu_fwd, swiglu_fwd_supports, swiglu_fwd_cost);
  add_cuda_kernels(out, ops::kSwigluBwd, swiglu_bwd, swiglu_bwd_supports, swiglu_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise
