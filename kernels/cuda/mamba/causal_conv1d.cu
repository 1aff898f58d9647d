// causal_conv1d / causal_conv1d_bwd (loom/ops/mamba.h): the depthwise causal convolution
// along T with an optional SiLU, and its gradient. Device code and launch geometry:
// causal_conv1d_kernel.cuh.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/mamba.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/mamba/causal_conv1d_kernel.cuh"
#include "kernels/cuda/mamba/registry.cuh"

namespace loom::kernels::cuda::mamba {
namespace {

template <class T, int kW>
void launch_fwd(const ConvArgs& a, cudaStream_t stream) {
  if (a.b * a.t * a.c > 0)
    causal_conv1d_fwd_kernel<T, kW>
        <<<grid_for(a.b * a.t * a.c, kConvThreads), kConvThreads, 0, stream>>>(a);
  if (kW > 1 && a.fin != nullptr && a.b * a.c > 0)
    causal_conv1d_state_kernel<T, kW>
        <<<grid_for(a.b * (kW - 1) * a.c, kConvThreads), kConvThreads, 0, stream>>>(a);
}

template <class T, int kW>
void launch_bwd(const ConvArgs& a, cudaStream_t stream) {
  if (a.b * a.t * a.c == 0) return;
  const int64_t steps = static_cast<int64_t>(kConvThreads / 32) * kConvTile;
  dim3 grid(static_cast<unsigned>((a.c + 31) / 32),
            static_cast<unsigned>((a.t + steps - 1) / steps), static_cast<unsigned>(a.b));
  const size_t smem = sizeof(float) * (kConvThreads / 32) * (kW + 1) * 32;
  causal_conv1d_bwd_kernel<T, kW><<<grid, kConvThreads, smem, stream>>>(a);
}

template <class T>
void launch(const ConvArgs& a, int64_t w, bool bwd, cudaStream_t stream) {
  switch (w) {
#define LOOM_CONV_CASE(W)                                            \
  case W:                                                            \
    bwd ? launch_bwd<T, W>(a, stream) : launch_fwd<T, W>(a, stream); \
    break;
    LOOM_CONV_CASE(1)
    LOOM_CONV_CASE(2)
    LOOM_CONV_CASE(3)
    LOOM_CONV_CASE(4)
    LOOM_CONV_CASE(5)
    LOOM_CONV_CASE(6)
    LOOM_CONV_CASE(7)
    LOOM_CONV_CASE(8)
#undef LOOM_CONV_CASE
    default:
      throw Error(Code::kInvalidArgument, "causal_conv1d: width " + std::to_string(w));
  }
}

op_checks::CausalConv1dShape check_fwd(const OpCall* c, bool s) {
  return op_checks::check_causal_conv1d(c, s, DeviceType::kCuda);
}
op_checks::CausalConv1dShape check_bwd(const OpCall* c, bool s) {
  return op_checks::check_causal_conv1d_bwd(c, s, DeviceType::kCuda);
}

Status causal_conv1d(const OpCall* call) {
  return guard([&] {
    op_checks::CausalConv1dShape s = check_fwd(call, false);
    const TensorView& x = call->inputs[0];
    current_device(ops::kCausalConv1d, x);
    ConvArgs a{};
    a.x = x.data;
    a.w = call->inputs[1].data;
    a.bias = call->inputs[2].data;
    a.init = call->inputs[3].data;
    a.y = call->outputs[0].data;
    a.fin = call->num_outputs > 1 ? call->outputs[1].data : nullptr;
    a.b = s.b, a.t = s.t, a.c = s.c;
    a.act = s.attrs.activation;
    LOOM_CUDA_FLOAT_SWITCH(x.dtype, T, ops::kCausalConv1d,
                           launch<T>(a, s.w, false, stream_of(call)));
    launch_check(ops::kCausalConv1d);
  });
}

Status causal_conv1d_bwd(const OpCall* call) {
  return guard([&] {
    op_checks::CausalConv1dShape s = check_bwd(call, false);
    const TensorView& x = call->inputs[1];
    current_device(ops::kCausalConv1dBwd, x);
    ConvArgs a{};
    a.dy = call->inputs[0].data;
    a.x = x.data;
    a.w = call->inputs[2].data;
    a.bias = call->inputs[3].data;
    a.init = call->inputs[4].data;
    a.y = call->outputs[0].data;
    a.dw = static_cast<float*>(call->outputs[1].data);
    a.db = call->num_outputs > 2 ? static_cast<float*>(call->outputs[2].data) : nullptr;
    a.b = s.b, a.t = s.t, a.c = s.c;
    a.act = s.attrs.activation;
    LOOM_CUDA_FLOAT_SWITCH(x.dtype, T, ops::kCausalConv1dBwd,
                           launch<T>(a, s.w, true, stream_of(call)));
    launch_check(ops::kCausalConv1dBwd);
  });
}

bool causal_conv1d_supports(const OpCall* call) {
  return check_passes([&] { check_fwd(call, true); });
}
bool causal_conv1d_bwd_supports(const OpCall* call) {
  return check_passes([&] { check_bwd(call, true); });
}

Status causal_conv1d_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::CausalConv1dShape s = check_fwd(call, true);
    *out = io_cost(call, static_cast<double>(s.b * s.t * s.c) * (2.0 * s.w + 4.0));
  });
}
Status causal_conv1d_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::CausalConv1dShape s = check_bwd(call, true);
    *out = io_cost(call, static_cast<double>(s.b * s.t * s.c) * (6.0 * s.w + 8.0));
  });
}

}  // namespace

void add_causal_conv1d_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kCausalConv1d, causal_conv1d, causal_conv1d_supports,
                   causal_conv1d_cost);
  add_cuda_kernels(out, ops::kCausalConv1dBwd, causal_conv1d_bwd, causal_conv1d_bwd_supports,
                   causal_conv1d_bwd_cost);
}

}  // namespace loom::kernels::cuda::mamba
