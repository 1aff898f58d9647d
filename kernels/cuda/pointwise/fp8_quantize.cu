// fp8_quantize (loom/ops.h): Y = fp8(X * scale[0]) and its transpose Yt, each optional, and
// amax[0] = max(amax[0], max |X|) (of X before scaling, NaN propagating), for X (M, K) in any
// float dtype and Y / Yt in E4M3 or E5M2. The kernels, their conversion and the choice between
// them (fp8_quantize_plan): fp8_quantize_kernel.cuh.
//
// LOOM_FP8_QUANTIZE=general sends every call with Yt to the general transpose kernel (to
// measure the typed one against it: tools/bench/fp8_quantize_bench); unset or "typed", the
// plan's choice.
#include <loom/cpp/op_checks/fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/fp8_quantize_kernel.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

bool general_forced() {
  static const bool general =
      env_choice("fp8_quantize", "LOOM_FP8_QUANTIZE", {"typed", "general"}) == 1;
  return general;
}

template <class T, bool kE5M2>
void launch_typed(const void* x, const float* scale, uint8_t* y, uint8_t* yt, float* amax,
                  float* scale_inv, const op_checks::Fp8QuantizeShape& s, unsigned blocks,
                  cudaStream_t stream) {
  const QuantizeTransposeArgs<T> a{
      static_cast<const T*>(x), scale, y, yt, amax, scale_inv, s.m, s.k};
  quantize_transpose_typed_kernel<T, kE5M2><<<blocks, kFp8TileThreads, 0, stream>>>(a);
}

template <bool kE5M2>
void launch(const OpCall* call, const op_checks::Fp8QuantizeShape& s) {
  const TensorView& X = call->inputs[0];
  const float* scale = static_cast<const float*>(call->inputs[1].data);
  uint8_t* y = s.y ? static_cast<uint8_t*>(call->outputs[0].data) : nullptr;
  uint8_t* yt = s.yt ? static_cast<uint8_t*>(call->outputs[1].data) : nullptr;
  float* amax = s.amax ? static_cast<float*>(call->outputs[2].data) : nullptr;
  float* scale_inv = s.scale_inv ? static_cast<float*>(call->outputs[3].data) : nullptr;
  const cudaStream_t stream = stream_of(call);
  const Fp8QuantizePlan p =
      fp8_quantize_plan(X.data, X.dtype, y, yt, s.m, s.k, yt != nullptr && general_forced(),
                        multiprocessor_count(X.device.index));
  switch (p.kernel) {
    case Fp8Kernel::kFlat:
      quantize_kernel<kE5M2><<<p.blocks, kFlatThreads, 0, stream>>>(X.data, X.dtype, scale, y, amax,
                                                                    scale_inv, s.m * s.k, p.vec);
      return;
    case Fp8Kernel::kTranspose:
      quantize_transpose_kernel<kE5M2><<<p.blocks, kFp8TileThreads, 0, stream>>>(
          X.data, X.dtype, scale, y, yt, amax, scale_inv, s.m, s.k, p.vec, p.vec_y, p.vec_yt);
      return;
    case Fp8Kernel::kTransposeTyped:
      switch (X.dtype) {
        case DType::kF32:
          return launch_typed<float, kE5M2>(X.data, scale, y, yt, amax, scale_inv, s, p.blocks,
                                            stream);
        case DType::kBF16:
          return launch_typed<__nv_bfloat16, kE5M2>(X.data, scale, y, yt, amax, scale_inv, s,
                                                    p.blocks, stream);
        default:
          return launch_typed<__half, kE5M2>(X.data, scale, y, yt, amax, scale_inv, s, p.blocks,
                                             stream);
      }
  }
}

}  // namespace

void launch_fp8_scale_inv(const float* scale, float* scale_inv, void* stream, const char* op) {
  quantize_kernel<false><<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(
      nullptr, DType::kF32, scale, nullptr, nullptr, scale_inv, 0, false);
  launch_check(op);
}

namespace {

Status fp8_quantize(const OpCall* call) {
  return guard([&] {
    const op_checks::Fp8QuantizeShape s =
        op_checks::check_fp8_quantize(call, false, DeviceType::kCuda);
    if (s.m * s.k == 0) {  // nothing to quantise, amax[0] unchanged; scale_inv still written
      if (s.scale_inv)
        launch_fp8_scale_inv(static_cast<const float*>(call->inputs[1].data),
                             static_cast<float*>(call->outputs[3].data), stream_of(call),
                             ops::kFp8Quantize);
      return;
    }
    if (s.out_dtype == DType::kF8E5M2)
      launch<true>(call, s);
    else
      launch<false>(call, s);
    launch_check(ops::kFp8Quantize);
  });
}

// One multiply and one compare per element.
LOOM_CUDA_HOOKS(fp8_quantize, op_checks::check_fp8_quantize, 2)

}  // namespace

void add_fp8_quantize_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kFp8Quantize, fp8_quantize, fp8_quantize_supports, fp8_quantize_cost);
}

}  // namespace loom::kernels::cuda::pointwise
