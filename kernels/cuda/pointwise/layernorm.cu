// layernorm_fwd / layernorm_bwd over the last dimension (loom/ops.h):
//   Y = (X - mean) * rstd * gamma + beta, gamma = weight (+ 1 with zero_centered_gamma);
//   dX = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dY * gamma,
//   dweight += sum_n dY * xhat, dbias += sum_n dY.
//
// Algorithm and launch geometry: norm.cuh (one team of 32..512 threads per row, the row in
// registers, f32 statistics, 8- or 16-byte accesses when C % 4 == 0; weight gradients in two
// stages, deterministic when the caller provides the workspace this file's workspace
// function asks for).
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/norm.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

op_checks::NormShape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_layernorm_fwd(c, s, d);
}
op_checks::NormShape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_layernorm_bwd(c, s, d);
}

Status layernorm_fwd(const OpCall* call) {
  return guard([&] {
    launch_norm_fwd<false>(call, check_fwd(call, false, DeviceType::kCuda), ops::kLayerNormFwd);
  });
}

Status layernorm_bwd(const OpCall* call) {
  return guard([&] {
    launch_norm_bwd<false>(call, check_bwd(call, false, DeviceType::kCuda), ops::kLayerNormBwd);
  });
}

uint64_t layernorm_bwd_workspace(const OpCall* call) {
  uint64_t bytes = 0;
  check_passes([&] {
    op_checks::NormShape s = check_bwd(call, true, DeviceType::kCuda);
    int grads = call->outputs[2].ndim > 0 || call->outputs[2].data != nullptr ? 2 : 1;
    bytes = norm_bwd_workspace_bytes(s.n, s.c, grads);
  });
  return bytes;
}

// Forward ~8 flops per element, backward ~14 (as the CPU kernels count them).
LOOM_CUDA_HOOKS(layernorm_fwd, check_fwd, 8)
LOOM_CUDA_HOOKS(layernorm_bwd, check_bwd, 14)

}  // namespace

void add_layernorm_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kLayerNormFwd, layernorm_fwd, layernorm_fwd_supports,
                   layernorm_fwd_cost);
  add_cuda_kernels(out, ops::kLayerNormBwd, layernorm_bwd, layernorm_bwd_supports,
                   layernorm_bwd_cost, {DType::kF32, DType::kBF16, DType::kF16}, kCudaName,
                   kCudaPriority, layernorm_bwd_workspace);
}

}  // namespace loom::kernels::cuda::pointwise
