// moe_unpermute and moe_unpermute_bwd (loom/ops/moe.h), the combine of expert rows back into
// tokens and its gradient, every float dtype:
//   forward   X[t] (N, C) = sum over k of w[t, k] * Y[slot_rows[t, k]], Y (M, C), added in k
//             order from 0 in f32 (w = 1 without weights); a choice with slot_rows -1 is
//             dropped
//   backward  dY[j] (M, C) = w[s] * dX[s / K] for s = row_slots[j], zeros for s = -1
//             dweights[t, k] (N, K) f32 = <dX[t], Y[slot_rows[t, k]]> summed in f64, 0 when
//             dropped
// Each output element is written once by one thread, in a fixed order: no atomics, the same
// bits on every run. The forward rounds each product and sum (__fmul_rn, __fadd_rn: no fused
// multiply-add) as the CPU reference's f32 loop does (kernels/cpu/moe_permute.cc).
//
// Indices: slot_rows in [-1, M) and row_slots in [-1, N * K) are valid (-1: dropped); others
// never address memory (they count as dropped) and are reported lazily (index_errors.cuh),
// where the CPU fails the call before computing. moe_unpermute_bwd checks slot_rows also
// without dweights (a small kernel), as the CPU does.
//
// Launch: the forward and dY run row_launch.cuh over the output's rows, a thread per chunk of
// 4 elements (one 16- or 8-byte access when C is a multiple of 4 and the tensors are aligned,
// else element by element); dweights runs a warp per (t, k) pair, lanes striding over C with
// f64 partial sums (the products of two f32 values are exact in f64), then a butterfly sum.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/moe.h>

#include <initializer_list>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/dtype.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/moe/index_errors.cuh"
#include "kernels/cuda/moe/registry.cuh"
#include "kernels/cuda/moe/row_launch.cuh"

namespace loom::kernels::cuda::moe {
namespace {

constexpr int kDwWarps = 8;  // (t, k) pairs per block of the dweights kernel

// X (N, C) from Y (M, C); W elements per chunk (C % W == 0).
template <class T, int W>
__global__ void unpermute_kernel(const T* __restrict__ y, const int32_t* __restrict__ slot_rows,
                                 const float* __restrict__ w, T* __restrict__ x, int64_t n,
                                 int64_t m, int64_t c, int64_t kk, IndexErrorSink sink) {
  const int64_t chunks = c / W;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int32_t* rows = slot_rows + t * kk;
    if (threadIdx.x == 0)
      for (int64_t k = 0; k < kk; ++k)
        if (rows[k] < -1 || rows[k] >= m) {
          report_index_error(sink, IndexOp::kUnpermuteSlotRows, t * kk + k, rows[k], m);
          break;
        }
    for (int64_t ch = threadIdx.x; ch < chunks; ch += blockDim.x) {
      float acc[W];
#pragma unroll
      for (int i = 0; i < W; ++i) acc[i] = 0.0f;
      for (int64_t k = 0; k < kk; ++k) {
        const int32_t r = rows[k];
        if (r < 0 || r >= m) continue;
        float v[W];
        load_pack<T, W>(y + r * c + ch * W, v);
        if (w != nullptr) {
          const float wk = w[t * kk + k];
#pragma unroll
          for (int i = 0; i < W; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(wk, v[i]));
        } else {
#pragma unroll
          for (int i = 0; i < W; ++i) acc[i] = __fadd_rn(acc[i], v[i]);
        }
      }
      store_pack<T, W>(x + t * c + ch * W, acc);
    }
  }
}

// dY (M, C) rows from dX (N, C) rows.
template <class T, int W>
__global__ void unpermute_bwd_dy_kernel(const T* __restrict__ dx,
                                        const int32_t* __restrict__ row_slots,
                                        const float* __restrict__ w, T* __restrict__ dy, int64_t m,
                                        int64_t c, int64_t kk, int64_t nk, IndexErrorSink sink) {
  const int64_t chunks = c / W;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; j < m;
       j += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int32_t s = row_slots[j];
    const bool ok = s >= 0 && s < nk;
    if (!ok && s != -1 && threadIdx.x == 0)
      report_index_error(sink, IndexOp::kUnpermuteBwdRowSlots, j, s, nk);
    const T* from = dx + (ok ? s / kk : 0) * c;
    const float ws = ok && w != nullptr ? w[s] : 1.0f;
    for (int64_t ch = threadIdx.x; ch < chunks; ch += blockDim.x) {
      float v[W];
      if (ok) {
        load_pack<T, W>(from + ch * W, v);
        if (w != nullptr) {
#pragma unroll
          for (int i = 0; i < W; ++i) v[i] = __fmul_rn(ws, v[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = 0.0f;
      }
      store_pack<T, W>(dy + j * c + ch * W, v);
    }
  }
}

// dweights (N, K) f32: a warp per (t, k) pair.
template <class T, int W>
__global__ void __launch_bounds__(32 * kDwWarps)
    unpermute_bwd_dw_kernel(const T* __restrict__ dx, const T* __restrict__ y,
                            const int32_t* __restrict__ slot_rows, float* __restrict__ dw,
                            int64_t n, int64_t m, int64_t c, int64_t kk, IndexErrorSink sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t chunks = c / W, pairs = n * kk;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kDwWarps + warp; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * kDwWarps) {
    const int32_t r = slot_rows[p];
    if (r < 0 || r >= m) {  // the same in every lane of the warp
      if (lane == 0) {
        if (r != -1) report_index_error(sink, IndexOp::kUnpermuteBwdSlotRows, p, r, m);
        dw[p] = 0.0f;
      }
      continue;
    }
    const T* a = dx + (p / kk) * c;
    const T* b = y + static_cast<int64_t>(r) * c;
    double acc = 0.0;
    for (int64_t ch = lane; ch < chunks; ch += 32) {
      float u[W], v[W];
      load_pack<T, W>(a + ch * W, u);
      load_pack<T, W>(b + ch * W, v);
#pragma unroll
      for (int i = 0; i < W; ++i) acc += static_cast<double>(u[i]) * static_cast<double>(v[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) dw[p] = static_cast<float>(acc);
  }
}

// moe_unpermute_bwd without dweights: slot_rows (count) in [-1, m), checked only.
__global__ void check_slot_rows_kernel(const int32_t* __restrict__ slot_rows, int64_t count,
                                       int64_t m, IndexErrorSink sink) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (slot_rows[i] < -1 || slot_rows[i] >= m)
      report_index_error(sink, IndexOp::kUnpermuteBwdSlotRows, i, slot_rows[i], m);
}

// True when rows of C elements of T may move as Pack<T, 4>: C % 4 == 0 and every base
// address aligned for it (null counts as aligned).
template <class T>
bool vec4(int64_t c, std::initializer_list<const void*> ptrs) {
  bool ok = c % 4 == 0;
  for (const void* p : ptrs) ok = ok && is_aligned(p, pack_alignment<T, 4>());
  return ok;
}

const float* opt_f32(const TensorView& v) {
  return v.data != nullptr ? static_cast<const float*>(v.data) : nullptr;
}

// ---- moe_unpermute ------------------------------------------------------------------------

template <class T, int W>
void launch_fwd(const OpCall* call, const op_checks::MoePermuteShape& s, IndexErrorSink sink,
                cudaStream_t stream) {
  RowLaunch g = row_launch(s.n, s.c / W);
  unpermute_kernel<T, W><<<g.grid, g.block, 0, stream>>>(
      static_cast<const T*>(call->inputs[0].data),
      static_cast<const int32_t*>(call->inputs[1].data), opt_f32(call->inputs[2]),
      static_cast<T*>(call->outputs[0].data), s.n, s.m, s.c, s.k, sink);
}

op_checks::MoePermuteShape check_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_unpermute(call, shapes_only, DeviceType::kCuda);
}

Status moe_unpermute(const OpCall* call) {
  return guard([&] {
    op_checks::MoePermuteShape s = check_fwd(call, false);
    const TensorView &Y = call->inputs[0], &X = call->outputs[0];
    const int device = current_device(ops::kMoeUnpermute, X);
    cudaStream_t stream = stream_of(call);
    IndexErrorSink sink = index_error_sink(device, stream);  // fails for an earlier error
    if (s.n == 0) return;  // with C == 0 the indices are still checked
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, ops::kMoeUnpermute, {
      if (vec4<T>(s.c, {Y.data, X.data}))
        launch_fwd<T, 4>(call, s, sink, stream);
      else
        launch_fwd<T, 1>(call, s, sink, stream);
    });
    launch_check(ops::kMoeUnpermute);
  });
}

bool moe_unpermute_supports(const OpCall* call) {
  return check_passes([&] { check_fwd(call, true); });
}

Status moe_unpermute_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    check_fwd(call, true);
    *out = io_cost(call, static_cast<double>(max_numel(call)));  // the CPU kernel's cost
  });
}

// ---- moe_unpermute_bwd --------------------------------------------------------------------

template <class T, int W>
void launch_bwd_dy(const OpCall* call, const op_checks::MoePermuteShape& s, IndexErrorSink sink,
                   cudaStream_t stream) {
  RowLaunch g = row_launch(s.m, s.c / W);
  unpermute_bwd_dy_kernel<T, W><<<g.grid, g.block, 0, stream>>>(
      static_cast<const T*>(call->inputs[0].data),
      static_cast<const int32_t*>(call->inputs[4].data), opt_f32(call->inputs[3]),
      static_cast<T*>(call->outputs[0].data), s.m, s.c, s.k, s.n * s.k, sink);
}

template <class T, int W>
void launch_bwd_dw(const OpCall* call, const op_checks::MoePermuteShape& s, IndexErrorSink sink,
                   cudaStream_t stream) {
  const int64_t pairs = s.n * s.k;
  unpermute_bwd_dw_kernel<T, W>
      <<<grid_for(pairs, 32 * kDwWarps, 65535), 32 * kDwWarps, 0, stream>>>(
          static_cast<const T*>(call->inputs[0].data), static_cast<const T*>(call->inputs[1].data),
          static_cast<const int32_t*>(call->inputs[2].data),
          static_cast<float*>(call->outputs[1].data), s.n, s.m, s.c, s.k, sink);
}

op_checks::MoePermuteShape check_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_unpermute_bwd(call, shapes_only, DeviceType::kCuda);
}

Status moe_unpermute_bwd(const OpCall* call) {
  return guard([&] {
    op_checks::MoePermuteShape s = check_bwd(call, false);
    const TensorView &dX = call->inputs[0], &Y = call->inputs[1], &dY = call->outputs[0];
    const bool dweights = call->outputs[1].data != nullptr;
    const int device = current_device(ops::kMoeUnpermuteBwd, dX);
    cudaStream_t stream = stream_of(call);
    IndexErrorSink sink = index_error_sink(device, stream);  // fails for an earlier error
    LOOM_CUDA_FLOAT_SWITCH(dX.dtype, T, ops::kMoeUnpermuteBwd, {
      if (s.m > 0) {
        if (vec4<T>(s.c, {dX.data, dY.data}))
          launch_bwd_dy<T, 4>(call, s, sink, stream);
        else
          launch_bwd_dy<T, 1>(call, s, sink, stream);
      }
      if (dweights && s.n * s.k > 0) {
        if (vec4<T>(s.c, {dX.data, Y.data}))
          launch_bwd_dw<T, 4>(call, s, sink, stream);
        else
          launch_bwd_dw<T, 1>(call, s, sink, stream);
      }
    });
    if (!dweights && s.n * s.k > 0)
      check_slot_rows_kernel<<<grid_for(s.n * s.k, kThreads), kThreads, 0, stream>>>(
          static_cast<const int32_t*>(call->inputs[2].data), s.n * s.k, s.m, sink);
    launch_check(ops::kMoeUnpermuteBwd);
  });
}

bool moe_unpermute_bwd_supports(const OpCall* call) {
  return check_passes([&] { check_bwd(call, true); });
}

Status moe_unpermute_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    check_bwd(call, true);
    *out = io_cost(call, static_cast<double>(max_numel(call)));  // the CPU kernel's cost
  });
}

}  // namespace

void add_unpermute_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kMoeUnpermute, moe_unpermute, moe_unpermute_supports,
                   moe_unpermute_cost);
  add_cuda_kernels(out, ops::kMoeUnpermuteBwd, moe_unpermute_bwd, moe_unpermute_bwd_supports,
                   moe_unpermute_bwd_cost);
}

}  // namespace loom::kernels::cuda::moe
