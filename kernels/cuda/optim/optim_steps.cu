// adamw_step, adamw_step_multi and sgd_step (loom/ops.h) on CUDA, on contiguous shards of f32
// master weights, and grad_norm_clip. AdamW's device code is adamw_kernel.cuh's (shared with
// the emulation test); SGD's is here, built the same way: packs of 4 elements when every
// pointer is aligned for them, grid-stride with at most 4096 blocks of 256 threads, 64-bit
// indices, the CPU kernels' f32 arithmetic element for element. grad_norm_clip is one
// thread.
#include <loom/cpp/adamw_coef.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/optim.h>
#include <loom/cpp/step_scalars.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/optim/adamw_kernel.cuh"
#include "kernels/cuda/optim/registry.cuh"

namespace loom::kernels::cuda::optim {
namespace {

struct SgdCoef {
  float lr, momentum, wd, gs;
  bool nesterov, first;  // first: step 1 (buf = g)
};

__device__ __forceinline__ SgdCoef sgd_coef(const ops::SgdAttrs& a) {
  return SgdCoef{a.lr, a.momentum, a.weight_decay, a.grad_scale, a.nesterov != 0, a.step == 1};
}

__device__ __forceinline__ void sgd_point(const SgdCoef& c, float g, float& w, float* buf) {
  g = g * c.gs + c.wd * w;
  float update = g;
  if (buf != nullptr) {
    *buf = c.first ? g : c.momentum * *buf + g;
    update = c.nesterov ? g + c.momentum * *buf : *buf;
  }
  w -= c.lr * update;
}

// `buf` may be null (momentum 0), `param` too.
template <class G, class P, bool kVec>
__global__ void sgd_kernel(const G* __restrict__ grad, float* __restrict__ w,
                           float* __restrict__ buf, P* __restrict__ param, int64_t n,
                           ops::SgdAttrs a, const double* __restrict__ scalars) {
  // sgd_attrs: `a` itself when the call has no step scalars.
  if (step_skipped(scalars)) return;
  const SgdCoef c = sgd_coef(sgd_attrs(a, scalars));
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (kVec) {
    const int64_t packs = n / 4;
    for (int64_t p = first; p < packs; p += stride) {
      const int64_t i = p * 4;
      float g[4], wv[4], bv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      load_pack<G, 4>(grad + i, g);
      load_pack<float, 4>(w + i, wv);
      if (buf != nullptr) load_pack<float, 4>(buf + i, bv);
#pragma unroll
      for (int k = 0; k < 4; ++k) sgd_point(c, g[k], wv[k], buf != nullptr ? &bv[k] : nullptr);
      store_pack<float, 4>(w + i, wv);
      if (buf != nullptr) store_pack<float, 4>(buf + i, bv);
      if (param != nullptr) store_pack<P, 4>(param + i, wv);
    }
    done = packs * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) {
    float wi = w[i];
    sgd_point(c, to_f32<G>(grad[i]), wi, buf != nullptr ? buf + i : nullptr);
    w[i] = wi;
    if (param != nullptr) param[i] = from_f32<P>(wi);
  }
}

// Whether every pointer is aligned for 4-element packs of its type.
template <class G, class P>
bool packs_fit(const void* grad, const void* param, std::initializer_list<const void*> states) {
  bool ok = is_aligned(grad, pack_alignment<G, 4>()) &&
            (param == nullptr || is_aligned(param, pack_alignment<P, 4>()));
  for (const void* s : states) ok = ok && is_aligned(s, 16);
  return ok;
}

// DType of the optional cast output (f32 when absent: the pointer is null then).
DType param_dtype(const TensorView& p) { return p.data != nullptr ? p.dtype : DType::kF32; }

// A moment's dtype (f32 or bf16: op_checks refused others) as its storage type T.
#define LOOM_MOMENT_SWITCH(dt, T, ...) \
  do {                                 \
    if ((dt) == DType::kBF16) {        \
      using T = __nv_bfloat16;         \
      __VA_ARGS__;                     \
    } else {                           \
      using T = float;                 \
      __VA_ARGS__;                     \
    }                                  \
  } while (0)

Status adamw_step(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_adamw_step(call, false, DeviceType::kCuda);
    const TensorView& G = call->inputs[0];
    current_device(ops::kAdamWStep, G);
    if (n == 0) return;
    const AdamCoef c = adamw_coef(*static_cast<const ops::AdamWAttrs*>(call->attrs));
    const double* scalars = op_checks::step_scalars(call, 1);
    if (scalars != nullptr) current_device(ops::kAdamWStep, call->inputs[1]);
    float* w = static_cast<float*>(call->outputs[0].data);
    const TensorView &Mv = call->outputs[1], &Vv = call->outputs[2], &Pv = call->outputs[3];
    cudaStream_t stream = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(G.dtype, Tg, ops::kAdamWStep, {
      LOOM_CUDA_FLOAT_SWITCH(param_dtype(Pv), Tp, ops::kAdamWStep, {
        LOOM_MOMENT_SWITCH(Mv.dtype, Tm, {
          LOOM_MOMENT_SWITCH(Vv.dtype, Tv, {
            const Tg* g = static_cast<const Tg*>(G.data);
            Tp* p = static_cast<Tp*>(Pv.data);
            Tm* m = static_cast<Tm*>(Mv.data);
            Tv* v = static_cast<Tv*>(Vv.data);
            const bool vec = packs_fit<Tg, Tp>(g, p, {w}) &&
                             is_aligned(m, pack_alignment<Tm, 4>()) &&
                             is_aligned(v, pack_alignment<Tv, 4>());
            if (vec)
              adamw_kernel<Tg, Tp, Tm, Tv, true>
                  <<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(g, w, m, v, p, n, c,
                                                                           scalars);
            else
              adamw_kernel<Tg, Tp, Tm, Tv, false>
                  <<<grid_for(n, kThreads), kThreads, 0, stream>>>(g, w, m, v, p, n, c, scalars);
          });
        });
      });
    });
    launch_check(ops::kAdamWStep);
  });
}

// Launches adamw_multi_kernel over `table` (blocks > 0) with gradients of `grad` and the
// group's params and moments.
void launch_multi(const MultiTable& table, DType grad, const MultiGroup& group,
                  cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(table.block_start[table.count]);
  LOOM_CUDA_FLOAT_SWITCH(grad, Tg, ops::kAdamWStepMulti, {
    LOOM_CUDA_FLOAT_SWITCH(group.param, Tp, ops::kAdamWStepMulti, {
      LOOM_MOMENT_SWITCH(group.m, Tm, {
        LOOM_MOMENT_SWITCH(group.v, Tv, {
          adamw_multi_kernel<Tg, Tp, Tm, Tv><<<blocks, kThreads, 0, stream>>>(table);
        });
      });
    });
  });
  launch_check(ops::kAdamWStepMulti);
}

Status adamw_step_multi(const OpCall* call) {
  return guard([&] {
    op_checks::check_adamw_step_multi(call, false, DeviceType::kCuda);
    const auto& a = *static_cast<const ops::AdamWMultiAttrs*>(call->attrs);
    const TensorView& G0 = call->inputs[0];
    current_device(ops::kAdamWStepMulti, G0);
    for (int32_t i = 1; i < a.count; ++i)
      if (call->inputs[i].device.index != G0.device.index)
        throw Error(Code::kInvalidArgument,
                    std::string(ops::kAdamWStepMulti) + ": grad[" + std::to_string(i) +
                        "] is on cuda:" + std::to_string(call->inputs[i].device.index) +
                        " but grad[0] on cuda:" + std::to_string(G0.device.index) +
                        ": one call updates the shards of one device");
    if (call->num_inputs > a.count) current_device(ops::kAdamWStepMulti, call->inputs[a.count]);
    cudaStream_t stream = stream_of(call);
    // One table per group of params' and moments' dtypes (the kernel is templated on them),
    // flushed when full. Usually every shard has the same.
    MultiTable table;  // ~15 KB: copied into the launch's parameters, so reused between them
    plan_multi(call, table, [&](const MultiTable& t, const MultiGroup& group) {
      launch_multi(t, G0.dtype, group, stream);
    });
  });
}

Status sgd_step(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_sgd_step(call, false, DeviceType::kCuda);
    const TensorView& G = call->inputs[0];
    current_device(ops::kSgdStep, G);
    if (n == 0) return;
    const auto& a = *static_cast<const ops::SgdAttrs*>(call->attrs);
    const double* scalars = op_checks::step_scalars(call, 1);
    if (scalars != nullptr) current_device(ops::kSgdStep, call->inputs[1]);
    float* w = static_cast<float*>(call->outputs[0].data);
    float* buf = a.momentum != 0.0f ? static_cast<float*>(call->outputs[1].data) : nullptr;
    const TensorView& Pv = call->outputs[2];
    cudaStream_t stream = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(G.dtype, Tg, ops::kSgdStep, {
      LOOM_CUDA_FLOAT_SWITCH(param_dtype(Pv), Tp, ops::kSgdStep, {
        const Tg* g = static_cast<const Tg*>(G.data);
        Tp* p = static_cast<Tp*>(Pv.data);
        if (packs_fit<Tg, Tp>(g, p, {w, buf}))
          sgd_kernel<Tg, Tp, true>
              <<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(g, w, buf, p, n, a, scalars);
        else
          sgd_kernel<Tg, Tp, false>
              <<<grid_for(n, kThreads), kThreads, 0, stream>>>(g, w, buf, p, n, a, scalars);
      });
    });
    launch_check(ops::kSgdStep);
  });
}

__global__ void grad_norm_clip_kernel(const double* __restrict__ sumsq, double* __restrict__ s,
                                      ops::GradNormClipAttrs a) {
  grad_norm_clip(*sumsq, a.max_norm, s);
}

Status grad_norm_clip_op(const OpCall* call) {
  return guard([&] {
    op_checks::check_grad_norm_clip(call, false, DeviceType::kCuda);
    current_device(ops::kGradNormClip, call->inputs[0]);
    current_device(ops::kGradNormClip, call->outputs[0]);
    grad_norm_clip_kernel<<<1, 1, 0, stream_of(call)>>>(
        static_cast<const double*>(call->inputs[0].data),
        static_cast<double*>(call->outputs[0].data),
        *static_cast<const ops::GradNormClipAttrs*>(call->attrs));
    launch_check(ops::kGradNormClip);
  });
}
bool grad_norm_clip_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_grad_norm_clip(call, true, DeviceType::kCuda); });
}
Status grad_norm_clip_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_grad_norm_clip(call, true, DeviceType::kCuda);
    *out = io_cost(call, 8.0);
  });
}

bool adamw_step_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_adamw_step(call, true, DeviceType::kCuda); });
}
bool adamw_step_multi_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_adamw_step_multi(call, true, DeviceType::kCuda); });
}
bool sgd_step_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_sgd_step(call, true, DeviceType::kCuda); });
}

// The CPU kernels' counts: 12 (AdamW) and 6 (SGD) floating-point operations per element, and
// the states read as well as written (op_checks::step_cost).
Status adamw_step_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_adamw_step(call, true, DeviceType::kCuda);
    *out = op_checks::step_cost(call, 12.0 * static_cast<double>(max_numel(call)), 4);
  });
}
// Every shard's elements (the sum of K adamw_step costs).
Status adamw_step_multi_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    const int64_t n = op_checks::check_adamw_step_multi(call, true, DeviceType::kCuda);
    *out = op_checks::step_cost(call, 12.0 * static_cast<double>(n), 4);
  });
}
Status sgd_step_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_sgd_step(call, true, DeviceType::kCuda);
    *out = op_checks::step_cost(call, 6.0 * static_cast<double>(max_numel(call)), 3);
  });
}

}  // namespace

void add_step_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kAdamWStep, adamw_step, adamw_step_supports, adamw_step_cost);
  add_cuda_kernels(out, ops::kAdamWStepMulti, adamw_step_multi, adamw_step_multi_supports,
                   adamw_step_multi_cost);
  add_cuda_kernels(out, ops::kSgdStep, sgd_step, sgd_step_supports, sgd_step_cost);
  add_cuda_kernels(out, ops::kGradNormClip, grad_norm_clip_op, grad_norm_clip_supports,
                   grad_norm_clip_cost, {DType::kF64});
}

}  // namespace loom::kernels::cuda::optim
