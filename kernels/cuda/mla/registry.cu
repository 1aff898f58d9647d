// add_mla_kernels (mla.h): the launchers of mla_kernel.cuh, one per op.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/mla.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/mla/mla.h"
#include "kernels/cuda/mla/mla_kernel.cuh"

namespace loom::kernels::cuda {
namespace {

using mla::kMlaThreads;
using mla::MlaArgs;
using op_checks::MlaShape;

MlaShape check_qkv(const OpCall* c, bool s) {
  return op_checks::check_mla_qkv(c, s, DeviceType::kCuda);
}
MlaShape check_qkv_bwd(const OpCall* c, bool s) {
  return op_checks::check_mla_qkv_bwd(c, s, DeviceType::kCuda);
}
MlaShape check_out(const OpCall* c, bool s) {
  return op_checks::check_mla_out(c, s, DeviceType::kCuda);
}
MlaShape check_out_bwd(const OpCall* c, bool s) {
  return op_checks::check_mla_out_bwd(c, s, DeviceType::kCuda);
}

// The call's tensors and sizes as kernel arguments.
MlaArgs args_of(const OpCall* call, const MlaShape& s) {
  MlaArgs a{};
  for (int i = 0; i < call->num_inputs && i < 3; ++i) a.in[i] = call->inputs[i].data;
  for (int i = 0; i < call->num_outputs && i < 3; ++i) a.out[i] = call->outputs[i].data;
  a.rows = s.b * s.t * s.h;
  a.h = s.h;
  a.dn = s.attrs.nope_dim;
  a.dr = s.attrs.rope_dim;
  a.dv = s.attrs.v_dim;
  return a;
}

Status mla_qkv(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_qkv(call, false);
    current_device(ops::kMlaQkv, call->inputs[0]);
    const MlaArgs a = args_of(call, s);
    const int64_t n = a.rows * (a.dn + a.dr);
    if (n == 0) return;
    cudaStream_t st = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(call->inputs[0].dtype, T, ops::kMlaQkv,
                           mla::mla_qkv_kernel<T>
                           <<<grid_for(n, kMlaThreads), kMlaThreads, 0, st>>>(a));
    launch_check(ops::kMlaQkv);
  });
}

Status mla_qkv_bwd(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_qkv_bwd(call, false);
    current_device(ops::kMlaQkvBwd, call->inputs[0]);
    const MlaArgs a = args_of(call, s);
    const int64_t n = a.rows * mla::mla_qkv_bwd_width(a.dn, a.dr, a.dv), nkpe = s.b * s.t * a.dr;
    cudaStream_t st = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(call->inputs[0].dtype, T, ops::kMlaQkvBwd, {
      if (n > 0) mla::mla_qkv_bwd_kernel<T><<<grid_for(n, kMlaThreads), kMlaThreads, 0, st>>>(a);
      // With H == 0 the sum over no heads is 0 (dkpe is then (B, T, dr) of zeros).
      if (nkpe > 0 && a.h > 0)
        mla::mla_dkpe_kernel<T><<<grid_for(nkpe, kMlaThreads), kMlaThreads, 0, st>>>(a);
      else if (nkpe > 0)
        cuda_check(cudaMemsetAsync(call->outputs[2].data, 0, nkpe * sizeof(T), st),
                   "mla_qkv_bwd: cudaMemsetAsync");
    });
    launch_check(ops::kMlaQkvBwd);
  });
}

Status mla_out(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_out(call, false);
    current_device(ops::kMlaOut, call->inputs[0]);
    const MlaArgs a = args_of(call, s);
    const int64_t n = a.rows * a.dv;
    if (n == 0) return;
    cudaStream_t st = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(call->inputs[0].dtype, T, ops::kMlaOut,
                           mla::mla_out_kernel<T>
                           <<<grid_for(n, kMlaThreads), kMlaThreads, 0, st>>>(a));
    launch_check(ops::kMlaOut);
  });
}

Status mla_out_bwd(const OpCall* call) {
  return guard([&] {
    const MlaShape s = check_out_bwd(call, false);
    current_device(ops::kMlaOutBwd, call->inputs[0]);
    const MlaArgs a = args_of(call, s);
    const int64_t n = a.rows * (a.dn + a.dr);
    if (n == 0) return;
    cudaStream_t st = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(call->inputs[0].dtype, T, ops::kMlaOutBwd,
                           mla::mla_out_bwd_kernel<T>
                           <<<grid_for(n, kMlaThreads), kMlaThreads, 0, st>>>(a));
    launch_check(ops::kMlaOutBwd);
  });
}

bool mla_qkv_supports(const OpCall* c) {
  return check_passes([&] { check_qkv(c, true); });
}
bool mla_qkv_bwd_supports(const OpCall* c) {
  return check_passes([&] { check_qkv_bwd(c, true); });
}
bool mla_out_supports(const OpCall* c) {
  return check_passes([&] { check_out(c, true); });
}
bool mla_out_bwd_supports(const OpCall* c) {
  return check_passes([&] { check_out_bwd(c, true); });
}

// Data movement: the bytes of every tensor, no FLOPs (dkpe's head sum is negligible).
Status mla_qkv_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    check_qkv(c, true);
    *out = io_cost(c, 0.0);
  });
}
Status mla_qkv_bwd_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    check_qkv_bwd(c, true);
    *out = io_cost(c, 0.0);
  });
}
Status mla_out_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    check_out(c, true);
    *out = io_cost(c, 0.0);
  });
}
Status mla_out_bwd_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    check_out_bwd(c, true);
    *out = io_cost(c, 0.0);
  });
}

}  // namespace

void add_mla_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kMlaQkv, mla_qkv, mla_qkv_supports, mla_qkv_cost);
  add_cuda_kernels(out, ops::kMlaQkvBwd, mla_qkv_bwd, mla_qkv_bwd_supports, mla_qkv_bwd_cost);
  add_cuda_kernels(out, ops::kMlaOut, mla_out, mla_out_supports, mla_out_cost);
  add_cuda_kernels(out, ops::kMlaOutBwd, mla_out_bwd, mla_out_bwd_supports, mla_out_bwd_cost);
}

}  // namespace loom::kernels::cuda
