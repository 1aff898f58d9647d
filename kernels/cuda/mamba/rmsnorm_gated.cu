// rmsnorm_gated / rmsnorm_gated_bwd (loom/ops/mamba.h): Mamba-2's gated RMSNorm over groups
// of channels, gate before the norm. Device code and launch geometry:
// rmsnorm_gated_kernel.cuh.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/mamba.h>

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/mamba/registry.cuh"
#include "kernels/cuda/mamba/rmsnorm_gated_kernel.cuh"

namespace loom::kernels::cuda::mamba {
namespace {

op_checks::RmsNormGatedShape check_fwd(const OpCall* c, bool s) {
  return op_checks::check_rmsnorm_gated(c, s, DeviceType::kCuda);
}
op_checks::RmsNormGatedShape check_bwd(const OpCall* c, bool s) {
  return op_checks::check_rmsnorm_gated_bwd(c, s, DeviceType::kCuda);
}

// Blocks of 8 warps, a warp per (row, group).
unsigned group_grid(const op_checks::RmsNormGatedShape& s) {
  return grid_for(s.n * (s.c / s.group_size), kGatedThreads / 32);
}

Status rmsnorm_gated(const OpCall* call) {
  return guard([&] {
    op_checks::RmsNormGatedShape s = check_fwd(call, false);
    const TensorView& y = call->inputs[0];
    current_device(ops::kRmsNormGated, y);
    if (s.n * s.c == 0) return;
    GatedArgs a{};
    a.y = y.data;
    a.z = call->inputs[1].data;
    a.w = call->inputs[2].data;
    a.out = call->outputs[0].data;
    a.rstd = static_cast<float*>(call->outputs[1].data);
    a.n = s.n, a.c = s.c, a.gs = s.group_size;
    a.eps = s.attrs.eps;
    LOOM_CUDA_FLOAT_SWITCH(y.dtype, T, ops::kRmsNormGated, {
      rmsnorm_gated_fwd_kernel<T><<<group_grid(s), kGatedThreads, 0, stream_of(call)>>>(a);
    });
    launch_check(ops::kRmsNormGated);
  });
}

Status rmsnorm_gated_bwd(const OpCall* call) {
  return guard([&] {
    op_checks::RmsNormGatedShape s = check_bwd(call, false);
    const TensorView& y = call->inputs[1];
    current_device(ops::kRmsNormGatedBwd, y);
    if (s.n * s.c == 0) return;
    GatedArgs a{};
    a.dout = call->inputs[0].data;
    a.y = y.data;
    a.z = call->inputs[2].data;
    a.w = call->inputs[3].data;
    a.rstd = static_cast<float*>(call->inputs[4].data);
    a.out = call->outputs[0].data;
    a.dz = call->outputs[1].data;
    a.dw = static_cast<float*>(call->outputs[2].data);
    a.n = s.n, a.c = s.c, a.gs = s.group_size;
    a.eps = s.attrs.eps;
    // dweight: about 1024 blocks of 32 channels x 8 row slices.
    const int64_t xblocks = (s.c + 31) / 32, row_blocks = (s.n + 7) / 8;
    const int64_t slices =
        std::clamp<int64_t>(1024 / xblocks, 1, std::min<int64_t>(row_blocks, 65535));
    const dim3 wgrid(static_cast<unsigned>(xblocks), static_cast<unsigned>(slices));
    LOOM_CUDA_FLOAT_SWITCH(y.dtype, T, ops::kRmsNormGatedBwd, {
      rmsnorm_gated_bwd_kernel<T><<<group_grid(s), kGatedThreads, 0, stream_of(call)>>>(a);
      rmsnorm_gated_wgrad_kernel<T>
          <<<wgrid, kGatedThreads, kGatedThreads * sizeof(float), stream_of(call)>>>(a);
    });
    launch_check(ops::kRmsNormGatedBwd);
  });
}

bool rmsnorm_gated_supports(const OpCall* call) {
  return check_passes([&] { check_fwd(call, true); });
}
bool rmsnorm_gated_bwd_supports(const OpCall* call) {
  return check_passes([&] { check_bwd(call, true); });
}
Status rmsnorm_gated_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::RmsNormGatedShape s = check_fwd(call, true);
    *out = io_cost(call, 10.0 * static_cast<double>(s.n * s.c));
  });
}
Status rmsnorm_gated_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::RmsNormGatedShape s = check_bwd(call, true);
    *out = io_cost(call, 24.0 * static_cast<double>(s.n * s.c));
  });
}

}  // namespace

void add_rmsnorm_gated_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kRmsNormGated, rmsnorm_gated, rmsnorm_gated_supports,
                   rmsnorm_gated_cost);
  add_cuda_kernels(out, ops::kRmsNormGatedBwd, rmsnorm_gated_bwd, rmsnorm_gated_bwd_supports,
                   rmsnorm_gated_bwd_cost);
}

}  // namespace loom::kernels::cuda::mamba
