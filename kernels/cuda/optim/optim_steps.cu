// adamw_step, adamw_step_multi and sgd_step (loom/ops.h) on CUDA, on contiguous f32 shards,
// and grad_norm_clip.
//
// Bandwidth-bound: each element reads grad and 2-3 f32 states and writes them back (plus
// the cast parameter), ~28 bytes per element for AdamW with bf16 grad and parameter. So
// each thread handles packs of 4 elements (16-byte f32 accesses, 8-byte 16-bit ones)
// when every pointer is aligned for them, else single elements (still coalesced); grid-
// stride with at most 4096 blocks of 256 threads, 64-bit indices. The arithmetic is the CPU
// kernels' f32 arithmetic element for element (bias corrections computed on the host in
// f64, as there); only FMA contraction may differ in the last bit.
//
// adamw_step_multi is the multi-tensor step (apex's multi_tensor_apply): one launch updates
// up to kMultiMaxShards shards, whose pointers, lengths and weight decays travel in the
// kernel's parameter (a __grid_constant__ table, no copy to device memory first). Each
// block owns one chunk of kMultiChunk elements of one shard and finds it by a binary search
// over the table's prefix of block starts. The elements go through adamw_range, the very
// code of adamw_step's kernel, so the results are adamw_step's bit for bit.
//
// Step scalars (a call's optional last input, loom/ops/optim.h): every thread reads them when
// the kernel runs and, unless the skip flag is set, computes the call's coefficients from
// them with the host's code (loom/cpp/adamw_coef.h, loom/cpp/step_scalars.h: f64, powers by
// repeated squaring), so a replayed graph's launch takes each step's values and gives what a
// launch with those values in its attrs gives. grad_norm_clip is one thread.
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
#include "kernels/cuda/optim/registry.cuh"

namespace loom::kernels::cuda::optim {
namespace {

using AdamCoef = AdamWCoef;  // loom/cpp/adamw_coef.h: shared with every kernel library

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

// AdamW over elements [begin, end) of one shard by thread `first` of `stride` threads: packs
// of 4 when kVec (begin a multiple of 4, every pointer aligned for packs), then the rest one
// by one. `param` (P) may be null: no cast copy. The one per-element code of both AdamW
// kernels: adamw_kernel runs it over a whole shard, grid-stride; adamw_multi_kernel over
// one chunk per block.
template <class G, class P, bool kVec>
__device__ __forceinline__ void adamw_range(const AdamCoef& c, const G* __restrict__ grad,
                                            float* __restrict__ w, float* __restrict__ m,
                                            float* __restrict__ v, P* __restrict__ param,
                                            int64_t begin, int64_t end, int64_t first,
                                            int64_t stride) {
  int64_t done = begin;
  if (kVec) {
    const int64_t pack_end = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + first * 4; i < pack_end; i += stride * 4) {
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
    done = pack_end;
  }
  for (int64_t i = done + first; i < end; i += stride) {
    float wi = w[i], mi = m[i], vi = v[i];
    adam_point(c, to_f32<G>(grad[i]), wi, mi, vi);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if (param != nullptr) param[i] = from_f32<P>(wi);
  }
}

// `scalars`: the call's step scalars, or null.
template <class G, class P, bool kVec>
__global__ void adamw_kernel(const G* __restrict__ grad, float* __restrict__ w,
                             float* __restrict__ m, float* __restrict__ v, P* __restrict__ param,
                             int64_t n, AdamCoef c, const double* __restrict__ scalars) {
  if (scalars != nullptr) {
    if (step_skipped(scalars)) return;
    c = adamw_coef(c, scalars);
  }
  adamw_range<G, P, kVec>(c, grad, w, m, v, param, 0, n,
                          int64_t{blockIdx.x} * blockDim.x + threadIdx.x,
                          int64_t{gridDim.x} * blockDim.x);
}

// ---- adamw_step_multi ------------------------------------------------------------------

// Shards per launch. The table below travels as the kernel's parameter, at most 32764 bytes
// on sm_70+ with CUDA 12.1 or newer (4 KB before): 256 shards take about 15 KB. A call with
// more shards launches once per 256.
inline constexpr int kMultiMaxShards = 256;
// Elements per block: 4 packs of 4 per thread of a 256-thread block. A chunk starts at a
// multiple of 4, so a shard whose pointers fit packs keeps them aligned in every chunk.
inline constexpr int64_t kMultiChunk = 4096;

struct MultiShard {
  const void* grad;  // (n) of the call's gradient dtype
  float* w;          // master (n)
  float* m;          // exp_avg (n)
  float* v;          // exp_avg_sq (n)
  void* param;       // (n) of the launch's param dtype, or null
  int64_t n;
  float wd;     // this shard's weight decay
  int32_t vec;  // 1: every pointer is aligned for 4-element packs
};

struct MultiTable {
  AdamCoef c;             // c.wd unused: each shard has its own
  const double* scalars;  // the call's step scalars, or null
  int32_t count;
  // block_start[i]: the first block of shard i; block_start[count]: the launch's blocks. An
  // empty shard has no block (its start equals the next one's).
  int32_t block_start[kMultiMaxShards + 1];
  MultiShard shard[kMultiMaxShards];
};
static_assert(sizeof(MultiTable) <= 32764,
              "adamw_step_multi's table exceeds the 32764 bytes of kernel parameters: lower "
              "kMultiMaxShards");

// One block per chunk. __grid_constant__: the table is read in place from the parameter
// space (dynamic indexing would otherwise copy all of it to each thread's local memory).
template <class G, class P>
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(const __grid_constant__ MultiTable table) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  // The shard holding block b: the last one whose first block is <= b (block_start[0] = 0).
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.block_start[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const MultiShard& s = table.shard[lo];
  AdamCoef c = table.c;
  if (table.scalars != nullptr) {
    if (step_skipped(table.scalars)) return;
    c = adamw_coef(c, table.scalars);
  }
  c.wd = s.wd;
  const int64_t begin = int64_t{b - table.block_start[lo]} * kMultiChunk;
  const int64_t end = begin + kMultiChunk < s.n ? begin + kMultiChunk : s.n;
  const G* g = static_cast<const G*>(s.grad);
  P* p = static_cast<P*>(s.param);
  if (s.vec)
    adamw_range<G, P, true>(c, g, s.w, s.m, s.v, p, begin, end, threadIdx.x, blockDim.x);
  else
    adamw_range<G, P, false>(c, g, s.w, s.m, s.v, p, begin, end, threadIdx.x, blockDim.x);
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

// Bytes a pointer to `t` must be aligned to for a 4-element pack (pack_alignment<T, 4>).
uintptr_t pack_bytes(DType t) {
  const uintptr_t b = 4 * static_cast<uintptr_t>(dtype_size(t));
  return b < 16 ? b : 16;
}

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
    float* m = static_cast<float*>(call->outputs[1].data);
    float* v = static_cast<float*>(call->outputs[2].data);
    const TensorView& Pv = call->outputs[3];
    cudaStream_t stream = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(G.dtype, Tg, ops::kAdamWStep, {
      LOOM_CUDA_FLOAT_SWITCH(param_dtype(Pv), Tp, ops::kAdamWStep, {
        const Tg* g = static_cast<const Tg*>(G.data);
        Tp* p = static_cast<Tp*>(Pv.data);
        if (packs_fit<Tg, Tp>(g, p, {w, m, v}))
          adamw_kernel<Tg, Tp, true><<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(
              g, w, m, v, p, n, c, scalars);
        else
          adamw_kernel<Tg, Tp, false>
              <<<grid_for(n, kThreads), kThreads, 0, stream>>>(g, w, m, v, p, n, c, scalars);
      });
    });
    launch_check(ops::kAdamWStep);
  });
}

// Launches adamw_multi_kernel over `table` (count >= 1, block starts filled) with gradients
// of `grad` and params of `param` (the dtype of every present param in the table).
void launch_multi(const MultiTable& table, DType grad, DType param, cudaStream_t stream) {
  const int32_t blocks = table.block_start[table.count];
  if (blocks == 0) return;  // every shard empty
  LOOM_CUDA_FLOAT_SWITCH(grad, Tg, ops::kAdamWStepMulti, {
    LOOM_CUDA_FLOAT_SWITCH(param, Tp, ops::kAdamWStepMulti, {
      adamw_multi_kernel<Tg, Tp><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table);
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
    const double* scalars = op_checks::step_scalars(call, a.count);
    if (scalars != nullptr) current_device(ops::kAdamWStepMulti, call->inputs[a.count]);
    cudaStream_t stream = stream_of(call);
    // One table per dtype of the cast params (the kernel is templated on it; a shard without
    // a param joins any table), flushed when full. Usually every param has one dtype.
    MultiTable table;  // ~15 KB: copied into the launch's parameters, so reused between them
    const DType param_types[] = {DType::kF32, DType::kBF16, DType::kF16};
    std::vector<bool> done(static_cast<size_t>(a.count), false);
    for (DType pt : param_types) {
      table.c = adamw_coef(a.lr, a.beta1, a.beta2, a.eps, 0.0f, a.grad_scale, a.step);
      table.scalars = scalars;
      table.count = 0;
      table.block_start[0] = 0;
      for (int32_t i = 0; i < a.count; ++i) {
        const TensorView& P = call->outputs[4 * i + 3];
        if (done[i] || (P.data != nullptr && P.dtype != pt)) continue;
        done[i] = true;
        const int64_t n = numel(call->inputs[i]);
        const int64_t blocks = (n + kMultiChunk - 1) / kMultiChunk;
        const int64_t start = table.block_start[table.count];
        if (table.count > 0 && (table.count == kMultiMaxShards || start + blocks > INT32_MAX)) {
          launch_multi(table, G0.dtype, pt, stream);
          table.count = 0;
        }
        MultiShard& s = table.shard[table.count];
        s.grad = call->inputs[i].data;
        s.w = static_cast<float*>(call->outputs[4 * i].data);
        s.m = static_cast<float*>(call->outputs[4 * i + 1].data);
        s.v = static_cast<float*>(call->outputs[4 * i + 2].data);
        s.param = P.data;
        s.n = n;
        s.wd = a.weight_decay[i];
        s.vec = is_aligned(s.grad, pack_bytes(G0.dtype)) && is_aligned(s.w, 16) &&
                is_aligned(s.m, 16) && is_aligned(s.v, 16) &&
                (s.param == nullptr || is_aligned(s.param, pack_bytes(pt)));
        table.block_start[table.count + 1] =
            static_cast<int32_t>(table.block_start[table.count] + blocks);
        ++table.count;
      }
      if (table.count > 0) launch_multi(table, G0.dtype, pt, stream);
    }
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

// The CPU kernels' counts: 12 (AdamW) and 6 (SGD) floating-point operations per element.
Status adamw_step_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_adamw_step(call, true, DeviceType::kCuda);
    *out = io_cost(call, 12.0 * static_cast<double>(max_numel(call)));
  });
}
// Every shard's elements (the sum of K adamw_step costs).
Status adamw_step_multi_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    const int64_t n = op_checks::check_adamw_step_multi(call, true, DeviceType::kCuda);
    *out = io_cost(call, 12.0 * static_cast<double>(n));
  });
}
Status sgd_step_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_sgd_step(call, true, DeviceType::kCuda);
    *out = io_cost(call, 6.0 * static_cast<double>(max_numel(call)));
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
