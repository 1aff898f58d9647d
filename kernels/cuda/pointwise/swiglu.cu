// swiglu_fwd / swiglu_bwd (loom/ops.h), Megatron's fused layout: X (N, 2F) holds the gate
// g = X[:, :F] then the up projection u = X[:, F:];
//   Y = silu(g) * u, silu(g) = g * sigmoid(g);
//   dg = dY * u * s * (1 + g (1 - s)), du = dY * g * s, s = sigmoid(g).
//
// Algorithm: elementwise in f32; sigmoid as 1 / (1 + exp(-g)), which tends to 0 and 1
// without NaN. dX may alias X.
//
// Launch (swiglu_kernel.cuh has the kernels): when X, dY and Y / dX share one dtype, the
// typed kernel, one thread per chunk of 16 bytes of a row (8 bf16 / f16 or 4 f32 j), each
// chunk's gate, up, dY and output one 16-byte access when F is a multiple of the chunk and
// the tensors are 16-byte aligned, else element by element; 32-bit chunk indices (one
// 32-bit division per chunk). Otherwise (a dtype mix, or 2^31 chunks and more) the general
// kernel: chunks of 4 with each tensor's dtype switched at run time, grid-striding with
// 64-bit indices. 256 threads per block in both.
//
// Why the typed kernel: the general one ran LLaMA 1.3B's swiglu (bf16, N = 8192, F = 5632)
// at ~1.3 TB/s on an H200 (2026-11-27 profile): a dtype switch per load, a 64-bit division
// per 4 elements and 8-byte accesses.
#include <loom/cpp/op_checks/activations.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/swiglu_kernel.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

template <class T>
void launch_typed(const SwigluPlan& p, const void* x, const void* dy, void* out, int64_t f,
                  cudaStream_t stream) {
  const SwigluTypedArgs<T> a = swiglu_typed_args<T>(p, x, dy, out, f);
  const unsigned blocks = swiglu_typed_blocks(p);
  if (p.vec)
    swiglu_typed_kernel<T, true><<<blocks, kFlatThreads, 0, stream>>>(a);
  else
    swiglu_typed_kernel<T, false><<<blocks, kFlatThreads, 0, stream>>>(a);
}

void launch_swiglu(const OpCall* call, op_checks::SwigluShape s, bool bwd, const char* op) {
  if (s.n == 0 || s.f == 0) return;
  const TensorView& x = call->inputs[bwd ? 1 : 0];
  const TensorView* dy = bwd ? &call->inputs[0] : nullptr;
  const TensorView& out = call->outputs[0];
  const void* dyp = dy ? dy->data : nullptr;
  const DType dyt = dy ? dy->dtype : x.dtype;
  const SwigluPlan p = swiglu_plan(x.data, x.dtype, dyp, dyt, out.data, out.dtype, s.n, s.f);
  if (p.typed) {
    LOOM_CUDA_FLOAT_SWITCH(x.dtype, T, op,
                           { launch_typed<T>(p, x.data, dyp, out.data, s.f, stream_of(call)); });
  } else {
    swiglu_kernel<<<grid_for(p.chunks, kFlatThreads), kFlatThreads, 0, stream_of(call)>>>(
        x.data, x.dtype, dyp, dyt, out.data, out.dtype, s.n, s.f, p.vec);
  }
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
