// adamw_step and sgd_step (loom/ops.h) on CUDA, on contiguous f32 shards (the optimizer
// calls them once per shard, often a whole flat buffer of parameters).
//
// Bandwidth-bound: each element reads grad and 2-3 f32 states and writes them back (plus
// the cast parameter), ~28 bytes per element for AdamW with bf16 grad and parameter. So
// each thread handles packs of 4 elements (16-byte f32 accesses, 8-byte 16-bit ones)
// when every pointer is aligned for them, else single elements (still coalesced); grid-
// stride with at most 4096 blocks of 256 threads, 64-bit indices. The arithmetic is the CPU
// kernels' f32 arithmetic element for element (bias corrections computed on the host in
// f64, as there); only FMA contraction may differ in the last bit.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/optim.h>

#include <cmath>

#include "kernels/cuda/blas/blas_util.cuh"
#include "kernels/cuda/blas/families.cuh"
#include "kernels/cuda/blas/resources.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/registration.h"

namespace loom::kernels::cuda::blas {
namespace {

struct AdamCoef {
  float lr, b1, b2, eps, wd, gs;
  float bc1;       // 1 / (1 - b1^t)
  float bc2_sqrt;  // 1 / sqrt(1 - b2^t)
};

AdamCoef adam_coef(const ops::AdamWAttrs& a) {
  const double t = static_cast<double>(a.step);
  return AdamCoef{
      a.lr,
      a.beta1,
      a.beta2,
      a.eps,
      a.weight_decay,
      a.grad_scale,
      static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta1), t))),
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), t)))};
}

__device__ __forceinline__ void adam_point(const AdamCoef& c, float g, float& w, float& m,
                                           float& v) {
  g *= c.gs;
  m = c.b1 * m + (1.0f - c.b1) * g;
  v = c.b2 * v + (1.0f - c.b2) * g * g;
  w -= c.lr * (m * c.bc1 / (sqrtf(v) * c.bc2_sqrt + c.eps) + c.wd * w);
}

struct SgdCoef {
  float lr, momentum, wd, gs;
  bool nesterov, first;  // first: step 1 (buf = g)
};

__device__ __forceinline__ void sgd_point(const SgdCoef& c, float g, float& w, float* buf) {
  g = g * c.gs + c.wd * w;
  float update = g;
  if (buf != nullptr) {
    *buf = c.first ? g : c.momentum * *buf + g;
    update = c.nesterov ? g + c.momentum * *buf : *buf;
  }
  w -= c.lr * update;
}

// `param` (P) may be null: no cast copy.
template <class G, class P, bool kVec>
__global__ void adamw_kernel(const G* __restrict__ grad, float* __restrict__ w,
                             float* __restrict__ m, float* __restrict__ v, P* __restrict__ param,
                             int64_t n, AdamCoef c) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (kVec) {
    const int64_t packs = n / 4;
    for (int64_t p = first; p < packs; p += stride) {
      const int64_t i = p * 4;
      float g[4], wv[4], mv[4], vv[4];
      load_pack<G, 4>(grad + i, g);
      load_pack<float, 4>(w + i, wv);
      load_pack<float, 4>(m + i, mv);
      load_pack<float, 4>(v + i, vv);
#pragma unroll
      for (int k = 0; k < 4; ++k) adam_point(c, g[k], wv[k], mv[k], vv[k]);
      store_pack<float, 4>(w + i, wv);
      store_pack<float, 4>(m + i, mv);
      store_pack<float, 4>(v + i, vv);
      if (param != nullptr) store_pack<P, 4>(param + i, wv);
    }
    done = packs * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) {
    float wi = w[i], mi = m[i], vi = v[i];
    adam_point(c, to_f32<G>(grad[i]), wi, mi, vi);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if (param != nullptr) param[i] = from_f32<P>(wi);
  }
}

// `buf` may be null (momentum 0), `param` too.
template <class G, class P, bool kVec>
__global__ void sgd_kernel(const G* __restrict__ grad, float* __restrict__ w,
                           float* __restrict__ buf, P* __restrict__ param, int64_t n, SgdCoef c) {
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

Status adamw_step(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_adamw_step(call, false, DeviceType::kCuda);
    const TensorView& G = call->inputs[0];
    current_device(ops::kAdamWStep, G);
    if (n == 0) return;
    const AdamCoef c = adam_coef(*static_cast<const ops::AdamWAttrs*>(call->attrs));
    float* w = static_cast<float*>(call->outputs[0].data);
    float* m = static_cast<float*>(call->outputs[1].data);
    float* v = static_cast<float*>(call->outputs[2].data);
    const TensorView& Pv = call->outputs[3];
    cudaStream_t stream = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(G.dtype, Tg, ops::kAdamWStep, {
      LOOM_CUDA_FLOAT_SWITCH(param_dtype(Pv), Tp, ops::kAdamWStep, {
        const Tg* g = static_cast<const Tg*>(G.data);
        Tp* p = static_cast<Tp*>(Pv.data);
        if (packs_fit<Tg, Tp>(g, p, {w, m, v}))
          adamw_kernel<Tg, Tp, true>
              <<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(g, w, m, v, p, n, c);
        else
          adamw_kernel<Tg, Tp, false>
              <<<grid_for(n, kThreads), kThreads, 0, stream>>>(g, w, m, v, p, n, c);
      });
    });
    launch_check(ops::kAdamWStep);
  });
}

Status sgd_step(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_sgd_step(call, false, DeviceType::kCuda);
    const TensorView& G = call->inputs[0];
    current_device(ops::kSgdStep, G);
    if (n == 0) return;
    const auto& a = *static_cast<const ops::SgdAttrs*>(call->attrs);
    const SgdCoef c{a.lr, a.momentum, a.weight_decay, a.grad_scale, a.nesterov != 0, a.step == 1};
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
              <<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(g, w, buf, p, n, c);
        else
          sgd_kernel<Tg, Tp, false>
              <<<grid_for(n, kThreads), kThreads, 0, stream>>>(g, w, buf, p, n, c);
      });
    });
    launch_check(ops::kSgdStep);
  });
}

bool adamw_step_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_adamw_step(call, true, DeviceType::kCuda); });
}
bool sgd_step_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_sgd_step(call, true, DeviceType::kCuda); });
}

// The CPU kernels' counts: 12 (AdamW) and 6 (SGD) floating-point operations per element.
Status adamw_step_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_adamw_step(call, true, DeviceType::kCuda);
    *out = io_cost(call, 12.0 * static_cast<double>(max_numel(call)));
  });
}
Status sgd_step_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_sgd_step(call, true, DeviceType::kCuda);
    *out = io_cost(call, 6.0 * static_cast<double>(max_numel(call)));
  });
}

}  // namespace

void add_optim_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kAdamWStep, adamw_step, adamw_step_supports, adamw_step_cost);
  add_cuda_kernels(out, ops::kSgdStep, sgd_step, sgd_step_supports, sgd_step_cost);
}

}  // namespace loom::kernels::cuda::blas
