// rmsnorm_fwd / rmsnorm_bwd over the last dimension (loom/ops.h):
//   Y = X * rstd * gamma, rstd = 1 / sqrt(mean(X^2) + eps), gamma = weight (+ 1 with
//   zero_centered_gamma); dX = rstd * (g - xhat * mean(g * xhat)), g = dY * gamma,
//   xhat = X * rstd; dweight += sum_n dY * xhat.
//
// Algorithm and launch geometry: norm.cuh (one team of 32..512 threads per row, the row in
// registers, f32 statistics, 8- or 16-byte accesses when C % 4 == 0; the weight gradient in
// two stages, deterministic when the caller provides the workspace this file's workspace
// function asks for).
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/norm.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

op_checks::NormShape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_rmsnorm_fwd(c, s, d);
}
op_checks::NormShape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_rmsnorm_bwd(c, s, d);
}

Status rmsnorm_fwd(const OpCall* call) {
  return guard([&] {
    launch_norm_fwd<true>(call, check_fwd(call, false, DeviceType::kCuda), ops::kRmsNormFwd);
  });
}

Status rmsnorm_bwd(const OpCall* call) {
  return guard([&] {
    launch_norm_bwd<true>(call, check_bwd(call, false, DeviceType::kCuda), ops::kRmsNormBwd);
  });
}

uint64_t rmsnorm_bwd_workspace(const OpCall* call) {
  uint64_t bytes = 0;
  check_passes([&] {
    op_checks::NormShape s = check_bwd(call, true, DeviceType::kCuda);
    bytes = norm_bwd_workspace_bytes(s.n, s.c, 1);
  });
  return bytes;
}

LOOM_CUDA_HOOKS(rmsnorm_fwd, check_fwd, 4)
LOOM_CUDA_HOOKS(rmsnorm_bwd, check_bwd, 8)

}  // namespace

void add_rmsnorm_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kRmsNormFwd, rmsnorm_fwd, rmsnorm_fwd_supports, rmsnorm_fwd_cost);
  add_cuda_kernels(out, ops::kRmsNormBwd, rmsnorm_bwd, rmsnorm_bwd_supports, rmsnorm_bwd_cost,
                   {DType::kF32, DType::kBF16, DType::kF16}, kCudaName, kCudaPriority,
                   rmsnorm_bwd_workspace);
}

}  // namespace loom::kernels::cuda::pointwise
