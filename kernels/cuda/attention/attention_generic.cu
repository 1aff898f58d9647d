// attention_fwd / attention_bwd for every call the tensor-core kernels do not take: f32, any
// head dim up to kAttentionGenericMaxD, tensors of differing float dtypes, unaligned views
// or row strides (Q, K, V, dQ, dK, dV may be strided views: AttentionParams' RowStrides).
// Plain CUDA cores, f32 arithmetic, never materialising (T, S); the same semantics (mask,
// Philox dropout index, lse, fully masked rows) as the reference. Two families:
//
// Tiled (attention_tiled_kernel.cuh): one storage dtype for every tensor, D <=
// kAttentionTiledMaxD, and a block's tiles within the device's shared memory (backward:
// 102.5 KB at D = 64, 166.5 KB at D = 128, within Hopper's 227 KB; forward: 68 / 116 KB). 64-row
// tiles, 256 threads per block, 4 x 4 products per thread; blocks per (query tile, b, h) for the
// forward and dQ, per (key tile, b, g) for dK and dV. This is what the default spec (f32, D = 64)
// runs: the warp-per-row kernels below took 7.1 of its 9.6 ms step on an H200 (BENCHMARKS.md),
// reading every key row once per query row.
//
// Warp per row (attention_generic_kernel.cuh), everything else: one warp per row, kWarps
// warps per block, each warp with its own slice of dynamic shared memory holding f32 rows
// of D (so any D fits) and 32 per-item scalars. Items (keys or queries) go by chunks of 32:
// lane j computes the dot products of item j over the whole D (the warp stages the rows in
// shared memory), the chunk's scalars meet in shared memory, then every lane updates its own
// columns d = lane, lane + 32, ... of the row accumulator (coalesced reads of V / Q / dO /
// K rows).
//   forward:  warp per query row (b, h, t): online softmax over key chunks.
//   backward: the delta kernel (attention_bwd.cu), then pass 1, warp per key row (b, s, g):
//             dK, dV summed over the group's query heads and all queries; pass 2, warp per
//             query row (b, t, h): dQ.
// In both, each output element has one writer: no atomics, and the result does not depend
// on scheduling.
#include <loom/cpp/error.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention/attention_generic_kernel.cuh"
#include "kernels/cuda/attention/attention_params.cuh"
#include "kernels/cuda/attention/attention_tiled_kernel.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/common/resources.cuh"

namespace loom::kernels::cuda {
namespace {

using namespace attn;

constexpr int kMaxWarps = 4;

// Shared memory a block of the current device may use (opt-in maximum).
size_t smem_budget(const char* op) {
  int device = 0, optin = 0;
  cuda_check(cudaGetDevice(&device), op);
  cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), op);
  return static_cast<size_t>(optin);
}

// Warps per block when each needs `per_warp` bytes of shared memory: up to kMaxWarps within
// what a block of the current device may use (227 KB on Hopper; the compute_90 PTX also
// runs on later GPUs with less, e.g. 99 KB). kAttentionGenericMaxD keeps one warp within
// 99 KB.
int warps_for(size_t per_warp, const char* op) {
  return static_cast<int>(std::clamp<size_t>(smem_budget(op) / per_warp, 1, kMaxWarps));
}

// Launches kernel<Io> with one warp per row, `floats_per_warp` of shared memory each.
template <class Kernel>
void launch_rows(Kernel kernel, const AttentionParams& p, int64_t rows, int64_t floats_per_warp,
                 cudaStream_t stream, const char* op) {
  if (rows == 0) return;
  const size_t per_warp = sizeof(float) * static_cast<size_t>(floats_per_warp);
  const int warps = warps_for(per_warp, op);
  const size_t smem = per_warp * warps;
  allow_dynamic_smem(kernel, smem, op);
  kernel<<<static_cast<unsigned>((rows + warps - 1) / warps), 32 * warps, smem, stream>>>(p);
  launch_check(op);
}

// The Io that serves the call: TypedIo<T> when every tensor has Q's dtype, else AnyIo.
template <class F>
void with_io(const AttentionParams& p, bool same, F&& f) {
  if (same && p.dt_q == DType::kBF16)
    f(TypedIo<__nv_bfloat16>{});
  else if (same && p.dt_q == DType::kF16)
    f(TypedIo<__half>{});
  else if (same && p.dt_q == DType::kF32)
    f(TypedIo<float>{});
  else
    f(AnyIo{});
}

// LOOM_ATTENTION_GENERIC=rows sends every call to the warp-per-row kernels (to measure the
// tiled ones against them: gpu_bundle_run.sh's "attn_rows" bench); unset or "tiled", the
// default choice below.
bool rows_forced() {
  static const bool rows =
      env_choice("attention", "LOOM_ATTENTION_GENERIC", {"tiled", "rows"}) == 1;
  return rows;
}

// Whether the tiled kernels take the call: `same` (one storage dtype), D within
// kAttentionTiledMaxD, and a block's `floats` of tiles within the device's budget (the
// forward's and the backward's are checked each on its own: a GPU with 99 KB a block runs
// the forward tiled at D = 64 and the backward per row).
bool use_tiled(const AttentionParams& p, bool same, int64_t floats, const char* op) {
  return same && !rows_forced() && p.d <= kAttentionTiledMaxD &&
         sizeof(float) * static_cast<size_t>(floats) <= smem_budget(op);
}

// Launches `kernel` (a tiled kernel instance): a block per 64-row tile of `rows` rows for
// each of `outer` (b, head) pairs, `floats` of shared memory each.
template <class Kernel>
void launch_tiled(Kernel kernel, const AttentionParams& p, int64_t rows, int64_t outer,
                  int64_t floats, cudaStream_t stream, const char* op) {
  const int64_t blocks = (rows + kTiledRows - 1) / kTiledRows * outer;
  if (blocks == 0) return;
  const size_t smem = sizeof(float) * static_cast<size_t>(floats);
  allow_dynamic_smem(kernel, smem, op);
  kernel<<<static_cast<unsigned>(blocks), kTiledThreads, smem, stream>>>(p);
  launch_check(op);
}

// Calls f(Io{}, std::integral_constant<int, kDv>{}) for the tiled kernels' instance.
// Q's dtype is every tensor's (use_tiled): no AnyIo instance.
template <class F>
void with_tiled(const AttentionParams& p, F&& f) {
  auto with_dv = [&](auto io) {
    if (tiled_dv(p.d) == 1)
      f(io, std::integral_constant<int, 1>{});
    else
      f(io, std::integral_constant<int, 2>{});
  };
  if (p.dt_q == DType::kBF16)
    with_dv(TypedIo<__nv_bfloat16>{});
  else if (p.dt_q == DType::kF16)
    with_dv(TypedIo<__half>{});
  else
    with_dv(TypedIo<float>{});
}

}  // namespace

void launch_attention_fwd_generic(const AttentionParams& p, cudaStream_t stream) {
  const bool same = p.dt_k == p.dt_q && p.dt_v == p.dt_q && p.dt_o == p.dt_q;
  if (use_tiled(p, same, tiled_fwd_floats(p.d), "attention_fwd")) {
    with_tiled(p, [&](auto io, auto dv) {
      launch_tiled(attention_fwd_tiled_kernel<decltype(io), decltype(dv)::value>, p, p.t, p.b * p.h,
                   tiled_fwd_floats(p.d), stream, "attention_fwd");
    });
    return;
  }
  with_io(p, same, [&](auto io) {
    using Io = decltype(io);
    launch_rows(attention_fwd_generic_kernel<Io>, p, p.b * p.h * p.t, generic_fwd_floats(p.d),
                stream, "attention_fwd");
  });
}

void launch_attention_bwd_generic(const AttentionParams& p, cudaStream_t stream) {
  launch_attention_bwd_delta(p, stream);
  const bool same = p.dt_k == p.dt_q && p.dt_v == p.dt_q && p.dt_do == p.dt_q &&
                    p.dt_dq == p.dt_q && p.dt_dk == p.dt_q && p.dt_dv == p.dt_q;
  if (use_tiled(p, same, tiled_bwd_floats(p.d), "attention_bwd")) {
    with_tiled(p, [&](auto io, auto dv) {
      constexpr int kDv = decltype(dv)::value;
      using Io = decltype(io);
      launch_tiled(attention_bwd_dkv_tiled_kernel<Io, kDv>, p, p.s, p.b * p.g,
                   tiled_bwd_floats(p.d), stream, "attention_bwd");
      launch_tiled(attention_bwd_dq_tiled_kernel<Io, kDv>, p, p.t, p.b * p.h, tiled_bwd_floats(p.d),
                   stream, "attention_bwd");
    });
    return;
  }
  with_io(p, same, [&](auto io) {
    using Io = decltype(io);
    launch_rows(attention_bwd_dkv_generic_kernel<Io>, p, p.b * p.s * p.g, generic_dkv_floats(p.d),
                stream, "attention_bwd");
    launch_rows(attention_bwd_dq_generic_kernel<Io>, p, p.b * p.t * p.h, generic_dq_floats(p.d),
                stream, "attention_bwd");
  });
}

}  // namespace loom::kernels::cuda
