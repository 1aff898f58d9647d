// swiglu_fp8_fwd / swiglu_fp8_bwd (loom/ops/fp8.h): swiglu's result (forward Y (N, F),
// backward dX (N, 2F)) quantised into FP8 as fp8_quantize would quantise it, with its
// transpose and amax, without the tensor in between: the bits of swiglu_fwd (or swiglu_bwd)
// into X's dtype followed by fp8_quantize, on these kernels.
//
// Algorithm (fp8_quantize_kernel.cuh: swiglu_fp8_kernel): fp8_quantize's typed tile loop
// (64 x 64 tiles of 16-byte chunks, the next tile's loads in flight while this one's
// transposed rows are stored), whose chunks are computed from X's gate and up (and dY) with
// swiglu's kernels' f32 expressions and rounded to X's dtype. The backward's two outputs (the
// gate's and the up projection's gradients) come from one load of a chunk's gate, up and dY.
// Element by element where the chunks are not whole or aligned (swiglu_fp8_plan).
//
// Bytes (bf16, backward, LLaMA 1.3B's N = 8192, F = 5632): reads X and dY once (6 N F), writes
// dX and dXt in FP8 (4 N F): 10 N F, where swiglu_bwd then fp8_quantize move 18 N F (the bf16
// dX written and read back).
#include <loom/cpp/op_checks/fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/fp8_quantize_kernel.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

template <class T, bool kBwd, bool kE5M2>
void launch_typed(const SwigluFp8Plan& p, const SwigluFp8Args<T>& a, cudaStream_t stream) {
  if (p.vec)
    swiglu_fp8_kernel<T, kBwd, true, kE5M2><<<p.blocks, kFp8TileThreads, 0, stream>>>(a);
  else
    swiglu_fp8_kernel<T, kBwd, false, kE5M2><<<p.blocks, kFp8TileThreads, 0, stream>>>(a);
}

void launch(const OpCall* call, const op_checks::SwigluFp8Shape& s, bool bwd, const char* op) {
  const TensorView& X = call->inputs[bwd ? 1 : 0];
  const void* dy = bwd ? call->inputs[0].data : nullptr;
  const float* scale = static_cast<const float*>(call->inputs[bwd ? 2 : 1].data);
  float* scale_inv = s.out.scale_inv ? static_cast<float*>(call->outputs[3].data) : nullptr;
  if (s.n * s.f == 0) {  // nothing to quantise, amax[0] unchanged; scale_inv still written
    if (scale_inv != nullptr) launch_fp8_scale_inv(scale, scale_inv, stream_of(call), op);
    return;
  }
  uint8_t* y = s.out.y ? static_cast<uint8_t*>(call->outputs[0].data) : nullptr;
  uint8_t* yt = s.out.yt ? static_cast<uint8_t*>(call->outputs[1].data) : nullptr;
  float* amax = s.out.amax ? static_cast<float*>(call->outputs[2].data) : nullptr;
  const SwigluFp8Plan p =
      swiglu_fp8_plan(X.data, dy, y, yt, X.dtype, s.n, s.f, multiprocessor_count(X.device.index));
  const bool e5m2 = s.out.out_dtype == DType::kF8E5M2;
  const cudaStream_t stream = stream_of(call);
  LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, op, {
    const SwigluFp8Args<T> a{static_cast<const T*>(X.data),
                             static_cast<const T*>(dy),
                             scale,
                             y,
                             yt,
                             amax,
                             scale_inv,
                             s.n,
                             s.f};
    if (bwd && e5m2)
      launch_typed<T, true, true>(p, a, stream);
    else if (bwd)
      launch_typed<T, true, false>(p, a, stream);
    else if (e5m2)
      launch_typed<T, false, true>(p, a, stream);
    else
      launch_typed<T, false, false>(p, a, stream);
  });
  launch_check(op);
}

op_checks::SwigluFp8Shape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_swiglu_fp8(c, s, d, false);
}
op_checks::SwigluFp8Shape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_swiglu_fp8(c, s, d, true);
}

Status swiglu_fp8_fwd(const OpCall* call) {
  return guard(
      [&] { launch(call, check_fwd(call, false, DeviceType::kCuda), false, ops::kSwigluFp8Fwd); });
}

Status swiglu_fp8_bwd(const OpCall* call) {
  return guard(
      [&] { launch(call, check_bwd(call, false, DeviceType::kCuda), true, ops::kSwigluFp8Bwd); });
}

// swiglu's 8 FLOPs an element plus the quantisation's 2.
LOOM_CUDA_HOOKS(swiglu_fp8_fwd, check_fwd, 10)
LOOM_CUDA_HOOKS(swiglu_fp8_bwd, check_bwd, 10)

}  // namespace

void add_swiglu_fp8_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kSwigluFp8Fwd, swiglu_fp8_fwd, swiglu_fp8_fwd_supports,
                   swiglu_fp8_fwd_cost);
  add_cuda_kernels(out, ops::kSwigluFp8Bwd, swiglu_fp8_bwd, swiglu_fp8_bwd_supports,
                   swiglu_fp8_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise
