// The device code of adamw_step and adamw_step_multi (loom/ops/optim.h), for optim_steps.cu's
// launchers and for the emulation test that runs it on the CPU
// (tests/kernels/cuda/optim_emulation).
//
// Bandwidth-bound: each element reads grad, the master and the two moments and writes all
// but grad back (plus the cast parameter): ~28 bytes an element with a bf16 grad and
// parameter and f32 moments, ~20 with bf16 moments. So each thread handles packs of 4
// elements (16-byte f32 accesses, 8-byte 16-bit ones) when every pointer is aligned for
// them, else single elements (still coalesced). The arithmetic is the CPU kernels' f32
// arithmetic element for element (the bias corrections come from loom/cpp/adamw_coef.h, as
// there); only FMA contraction may differ in the last bit.
//
// The moments are f32 or bf16 (M, V): a bf16 moment is widened to f32, updated by the same
// code as an f32 one and rounded back to nearest even, so its bits are those of the f32
// moment's update followed by a cast.
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
// them with the host's code (loom/cpp/adamw_coef.h, loom/cpp/step_scalars.h), so a replayed
// graph's launch takes each step's values and gives what a launch with those values in its
// attrs gives.
#pragma once

#include <loom/cpp/adamw_coef.h>
#include <loom/cpp/step_scalars.h>
#include <loom/cpp/tensor.h>
#include <stdint.h>

#include <vector>

#include "kernels/cuda/common/device_util.cuh"

namespace loom::kernels::cuda::optim {

using AdamCoef = AdamWCoef;  // loom/cpp/adamw_coef.h: shared with every kernel library

__device__ __forceinline__ void adam_point(const AdamCoef& c, float g, float& w, float& m,
                                           float& v) {
  g *= c.gs;
  m = c.b1 * m + (1.0f - c.b1) * g;
  v = c.b2 * v + (1.0f - c.b2) * g * g;
  w -= c.lr * (m * c.bc1 / (sqrtf(v) * c.bc2_sqrt + c.eps) + c.wd * w);
}

// AdamW over elements [begin, end) of one shard by thread `first` of `stride` threads: packs
// of 4 when kVec (begin a multiple of 4, every pointer aligned for packs), then the rest one
// by one. grad G, master f32, moments M and V (f32 or bf16), `param` P, which may be null:
// no cast copy. The one per-element code of both AdamW kernels: adamw_kernel runs it over a
// whole shard, grid-stride; adamw_multi_kernel over one chunk per block.
template <class G, class P, class M, class V, bool kVec>
__device__ __forceinline__ void adamw_range(const AdamCoef& c, const G* __restrict__ grad,
                                            float* __restrict__ w, M* __restrict__ m,
                                            V* __restrict__ v, P* __restrict__ param, int64_t begin,
                                            int64_t end, int64_t first, int64_t stride) {
  int64_t done = begin;
  if (kVec) {
    const int64_t pack_end = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + first * 4; i < pack_end; i += stride * 4) {
      float g[4], wv[4], mv[4], vv[4];
      load_pack<G, 4>(grad + i, g);
      load_pack<float, 4>(w + i, wv);
      load_pack<M, 4>(m + i, mv);
      load_pack<V, 4>(v + i, vv);
#pragma unroll
      for (int k = 0; k < 4; ++k) adam_point(c, g[k], wv[k], mv[k], vv[k]);
      store_pack<float, 4>(w + i, wv);
      store_pack<M, 4>(m + i, mv);
      store_pack<V, 4>(v + i, vv);
      if (param != nullptr) store_pack<P, 4>(param + i, wv);
    }
    done = pack_end;
  }
  for (int64_t i = done + first; i < end; i += stride) {
    float wi = w[i], mi = to_f32<M>(m[i]), vi = to_f32<V>(v[i]);
    adam_point(c, to_f32<G>(grad[i]), wi, mi, vi);
    w[i] = wi;
    m[i] = from_f32<M>(mi);
    v[i] = from_f32<V>(vi);
    if (param != nullptr) param[i] = from_f32<P>(wi);
  }
}

// adamw_step over one shard of n elements, grid-stride. `scalars`: the call's step scalars,
// or null.
template <class G, class P, class M, class V, bool kVec>
__global__ void adamw_kernel(const G* __restrict__ grad, float* __restrict__ w, M* __restrict__ m,
                             V* __restrict__ v, P* __restrict__ param, int64_t n, AdamCoef c,
                             const double* __restrict__ scalars) {
  if (scalars != nullptr) {
    if (step_skipped(scalars)) return;
    c = adamw_coef(c, scalars);
  }
  adamw_range<G, P, M, V, kVec>(c, grad, w, m, v, param, 0, n,
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
  void* m;           // exp_avg (n) of the launch's M
  void* v;           // exp_avg_sq (n) of the launch's V
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
template <class G, class P, class M, class V>
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
  M* m = static_cast<M*>(s.m);
  V* v = static_cast<V*>(s.v);
  P* p = static_cast<P*>(s.param);
  if (s.vec)
    adamw_range<G, P, M, V, true>(c, g, s.w, m, v, p, begin, end, threadIdx.x, blockDim.x);
  else
    adamw_range<G, P, M, V, false>(c, g, s.w, m, v, p, begin, end, threadIdx.x, blockDim.x);
}

// Bytes a pointer to `t` must be aligned to for a 4-element pack (pack_alignment<T, 4>).
inline uintptr_t pack_bytes(DType t) {
  const uintptr_t b = 4 * static_cast<uintptr_t>(dtype_size(t));
  return b < 16 ? b : 16;
}

// The storage types of one adamw_multi_kernel launch: the present params' dtype and the
// moments'. Every shard of its table has them (a shard without a param joins any group).
struct MultiGroup {
  DType param, m, v;
};

// The launches of an adamw_step_multi call (checked by op_checks::check_adamw_step_multi):
// its shards grouped by MultiGroup, each group's shards into `table` (at most
// kMultiMaxShards a launch, and at most INT32_MAX blocks), and launch(table, group) called
// for every table that has a block. Host code, shared with the emulation test.
template <class Launch>
void plan_multi(const OpCall* call, MultiTable& table, Launch&& launch) {
  const auto& a = *static_cast<const ops::AdamWMultiAttrs*>(call->attrs);
  const double* scalars =
      call->num_inputs > a.count ? static_cast<const double*>(call->inputs[a.count].data) : nullptr;
  const DType grad = call->inputs[0].dtype;
  const DType param_types[] = {DType::kF32, DType::kBF16, DType::kF16};
  const DType moment_types[] = {DType::kF32, DType::kBF16};
  std::vector<bool> done(static_cast<size_t>(a.count), false);
  auto flush = [&](const MultiGroup& group) {
    if (table.count > 0 && table.block_start[table.count] > 0) launch(table, group);
    table.count = 0;
  };
  for (DType pt : param_types)
    for (DType mt : moment_types)
      for (DType vt : moment_types) {
        const MultiGroup group{pt, mt, vt};
        table.c = adamw_coef(a.lr, a.beta1, a.beta2, a.eps, 0.0f, a.grad_scale, a.step);
        table.scalars = scalars;
        table.count = 0;
        table.block_start[0] = 0;
        for (int32_t i = 0; i < a.count; ++i) {
          const TensorView& P = call->outputs[4 * i + 3];
          const TensorView& M = call->outputs[4 * i + 1];
          const TensorView& V = call->outputs[4 * i + 2];
          if (done[i] || (P.data != nullptr && P.dtype != pt) || M.dtype != mt || V.dtype != vt)
            continue;
          done[i] = true;
          const int64_t n = numel(call->inputs[i]);
          const int64_t blocks = (n + kMultiChunk - 1) / kMultiChunk;
          if (table.count == kMultiMaxShards ||
              int64_t{table.block_start[table.count]} + blocks > INT32_MAX)
            flush(group);
          MultiShard& s = table.shard[table.count];
          s.grad = call->inputs[i].data;
          s.w = static_cast<float*>(call->outputs[4 * i].data);
          s.m = M.data;
          s.v = V.data;
          s.param = P.data;
          s.n = n;
          s.wd = a.weight_decay[i];
          s.vec = is_aligned(s.grad, pack_bytes(grad)) && is_aligned(s.w, 16) &&
                  is_aligned(s.m, pack_bytes(mt)) && is_aligned(s.v, pack_bytes(vt)) &&
                  (s.param == nullptr || is_aligned(s.param, pack_bytes(pt)));
          table.block_start[table.count + 1] =
              static_cast<int32_t>(table.block_start[table.count] + blocks);
          ++table.count;
        }
        flush(group);
      }
}

}  // namespace loom::kernels::cuda::optim
