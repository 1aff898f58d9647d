// fp8_scale_update (loom/ops.h): delayed scaling of Q FP8 quantisers in one launch. Each
// quantiser q is a column of the amax history (L, Q):
//   amax_q      = max over the L rows of column q (algo 0) or history[current, q] (algo 1)
//   scale_q     = fp8_max[q] / amax_q / 2^margin when amax_q is finite and > 0 (FLT_MAX when
//                 that is infinite), else the old scale_q
//   scale_inv_q = 1 / scale_q
// then row `next` is zeroed (next >= 0) for the coming step's amaxes.
//
// One thread per quantiser: it reads its own column, then writes its scales and zeroes its
// own element of row `next`, so the zeroing follows every read of that element without a
// barrier (no other thread reads it). Consecutive threads take consecutive columns: each
// history row is read coalesced. The max propagates NaN as the "amax" op does (a NaN in the
// window leaves the scale as it was). 2^margin is computed once on the host, in f64 and
// rounded to f32 (exact for integer margins); the divisions are IEEE f32 ones, in the
// contract's order.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/fp8.h>

#include <cfloat>
#include <cmath>

#include "kernels/cuda/common/amax.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/optim/registry.cuh"

namespace loom::kernels::cuda::optim {
namespace {

// history (L, Q); fp8_max, scale, scale_inv (Q). algo 0: max over the rows, 1: row `current`.
__global__ void fp8_scale_update_kernel(const float* __restrict__ fp8_max,
                                        float* __restrict__ history, float* __restrict__ scale,
                                        float* __restrict__ scale_inv, int64_t rows,
                                        int64_t q_count, int algo, int64_t current, int64_t next,
                                        float pow2_margin) {
  const int64_t q = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (q >= q_count) return;
  float amax;
  if (algo == 1) {
    amax = history[current * q_count + q];
  } else {
    amax = history[q];
    for (int64_t l = 1; l < rows; ++l) amax = nan_max(amax, history[l * q_count + q]);
  }
  float s = scale[q];
  if (isfinite(amax) && amax > 0.0f) {
    const float fresh = fp8_max[q] / amax / pow2_margin;
    s = isinf(fresh) ? FLT_MAX : fresh;
  }
  scale[q] = s;
  scale_inv[q] = 1.0f / s;
  if (next >= 0) history[next * q_count + q] = 0.0f;
}

Status fp8_scale_update(const OpCall* call) {
  return guard([&] {
    const op_checks::Fp8ScaleShape s =
        op_checks::check_fp8_scale_update(call, false, DeviceType::kCuda);
    if (s.quantizers == 0) return;
    current_device(ops::kFp8ScaleUpdate, call->outputs[0]);
    const ops::Fp8ScaleAttrs& at = s.attrs;
    const float pow2_margin = std::exp2(at.margin);  // float, as the CPU kernel computes it
    fp8_scale_update_kernel<<<blocks_for(s.quantizers, kThreads), kThreads, 0, stream_of(call)>>>(
        static_cast<const float*>(call->inputs[0].data), static_cast<float*>(call->outputs[0].data),
        static_cast<float*>(call->outputs[1].data), static_cast<float*>(call->outputs[2].data),
        s.history_len, s.quantizers, at.algo, at.current, at.next, pow2_margin);
    launch_check(ops::kFp8ScaleUpdate);
  });
}

bool fp8_scale_update_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_fp8_scale_update(call, true, DeviceType::kCuda); });
}

// Per quantiser: a compare per history row, two divisions and a reciprocal.
Status fp8_scale_update_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    const op_checks::Fp8ScaleShape s =
        op_checks::check_fp8_scale_update(call, true, DeviceType::kCuda);
    *out = io_cost(call, static_cast<double>((s.history_len + 3) * s.quantizers));
  });
}

}  // namespace

void add_fp8_scale_update_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kFp8ScaleUpdate, fp8_scale_update, fp8_scale_update_supports,
                   fp8_scale_update_cost, {DType::kF32});
}

}  // namespace loom::kernels::cuda::optim
