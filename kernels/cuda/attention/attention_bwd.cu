// attention_bwd on tensor cores (bf16 / f16, D in {64, 128}): FlashAttention-2 backward,
// in three kernels on the call's stream.
//
// 1. delta kernel: delta[b, h, t] = rowsum(dO * O) (the sum_s P dP of the softmax gradient,
//    which holds with dropout too), and zeroes the f32 dQ accumulator. One warp per row.
// 2. main kernel: one block of kWarps warps per (key tile of kBc = 16 kWarps keys, b, kv
//    head g), flattened into blockIdx.x with the key tile slowest (under the causal mask the
//    first key tiles see the most queries, so they start first). Warp w owns keys
//    [16 w, 16 w + 16) of the tile and accumulates their dK and dV, (16, D) f32 each, in
//    registers over every query tile of every query head of the group (H / G heads), so a
//    kv head's gradient sums its query heads inside one block: no two blocks write the same
//    dK / dV row and no atomics are needed for them. Per query tile of kBr rows (Q, dO, lse
//    and delta double-buffered in shared memory, cp.async of the next tile during this one):
//      S^T = K Q^T and dP^T = V dO^T, (16 keys, kBr queries) per warp, by mma.sync;
//      P^T = exp2(S^T scale log2e - lse log2e), masked; with dropout multiplier z
//      (keep / (1 - p), Philox of ((b H + h) T + t) S + s):
//      dS^T = scale P^T (dP^T z - delta), dV += (P^T z) dO, dK += dS^T Q (registers);
//      dS^T goes to shared memory, and after a barrier each warp computes a (16, D / split)
//      piece of dQ = dS K for the tile's queries, added with f32 atomics (red.global.add)
//      into the (B, T, H, D) workspace: dQ rows are shared by every key tile, so either
//      atomics or a second pass that recomputes S and dP (7 matmuls instead of 5) is needed;
//      atomics cost less, at the price of a summation order that varies from run to run
//      (f32 rounding only).
//    Query tiles that the causal mask hides from every key of the tile are skipped.
//    When those blocks are too few to fill the GPU (MQA or few kv heads, a small batch,
//    short sequences: fewer than two per multiprocessor), each (key tile, b, g) gets
//    head_splits blocks instead, each over its share of the group's query heads, which
//    write their partial dK, dV in f32 to a workspace (attention_bwd_head_splits).
// 3. convert kernel: dQ = dq_acc rounded to the storage dtype; with split heads, a reduce
//    kernel sums the partial dK, dV in split order (deterministic) into dK, dV. The
//    workspaces are packed; these two (and the main kernel's direct dK, dV stores) write
//    the rows of the views dQ, dK, dV at their row strides.
//
// Shared memory (elements of T unless noted, rows padded by 16 bytes against bank
// conflicts): K, V (kBc, D + 8); Q, dO (2, kBr, D + 8); dS^T (kBc, kBr + 8); lse, delta,
// segment ids (2, kBr) of 4 bytes. D = 64 (kBr 64): 66 KB; D = 128 (kBr 32): 75 KB.
// ptxas (sm_90a, CUDA 13.0): 246 (D = 64) and 255 (D = 128) registers, no spills, so two
// blocks of 128 threads per SM.
//
// Expected bottleneck (for tuning): the dQ atomics (kBr * D per block and query tile) and
// the two barriers per query tile; larger kBc (8 warps) halves the atomics per key, and
// wgmma would take the five matmuls off the mma.sync issue path.
#include "kernels/cuda/attention/attention_bwd_kernel.cuh"
#include "kernels/cuda/attention/attention_params.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/resources.cuh"

namespace loom::kernels::cuda {
namespace {

using namespace attn;

// Blocks of 256 threads (8 warps) for a grid-stride loop of a warp per row over `rows`
// rows (at most 65536 blocks).
unsigned stride_grid(int64_t rows) {
  const int64_t want = (rows + 7) / 8;
  return static_cast<unsigned>(want < 65536 ? want : 65536);
}

template <class T, int D, int kWarps, int kBr>
void launch_bwd(const AttentionParams& p, cudaStream_t stream) {
  using Tile = BwdTile<D, kWarps, kBr>;
  static_assert(Tile::kBc == kAttentionBwdKeysPerBlock, "attention_bwd_head_splits assumes it");
  const int64_t splits = p.head_splits > 1 ? p.head_splits : 1;
  const int64_t blocks = (p.s + Tile::kBc - 1) / Tile::kBc * p.b * p.g * splits;
  if (blocks > 0) {
    const size_t smem = Tile::template smem_bytes<T>();
    auto kernel = attention_bwd_tc_kernel<T, D, kWarps, kBr>;
    allow_dynamic_smem(kernel, smem, "attention_bwd");
    kernel<<<static_cast<unsigned>(blocks), Tile::kThreads, smem, stream>>>(p);
    launch_check("attention_bwd");
  }
  const int64_t kv_rows = p.b * p.s * p.g;
  if (splits > 1 && kv_rows > 0) {
    attention_dkv_reduce_kernel<T, D><<<stride_grid(kv_rows), 256, 0, stream>>>(p);
    launch_check("attention_bwd");
  }
  const int64_t q_rows = p.b * p.t * p.h;
  if (q_rows > 0) {
    attention_dq_convert_kernel<T, D><<<stride_grid(q_rows), 256, 0, stream>>>(p);
    launch_check("attention_bwd");
  }
}

template <class T>
void launch_bwd_dtype(const AttentionParams& p, cudaStream_t stream) {
  // (kWarps, kBr): 64 keys per block; 64 queries per step for D = 64, 32 for D = 128 (the
  // (16, D) dK and dV accumulators already take 128 registers per lane there).
  if (p.d == 64)
    launch_bwd<T, 64, 4, 64>(p, stream);
  else
    launch_bwd<T, 128, 4, 32>(p, stream);
}

}  // namespace

void launch_attention_bwd_delta(const AttentionParams& p, cudaStream_t stream) {
  const int64_t rows = p.b * p.t * p.h;
  if (rows == 0) return;
  constexpr int kWarps = 8;
  const unsigned grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  const bool same = p.dt_do == p.dt_o;
  if (same && p.dt_o == DType::kBF16)
    attention_bwd_delta_kernel<TypedIo<__nv_bfloat16>><<<grid, 32 * kWarps, 0, stream>>>(p);
  else if (same && p.dt_o == DType::kF16)
    attention_bwd_delta_kernel<TypedIo<__half>><<<grid, 32 * kWarps, 0, stream>>>(p);
  else if (same && p.dt_o == DType::kF32)
    attention_bwd_delta_kernel<TypedIo<float>><<<grid, 32 * kWarps, 0, stream>>>(p);
  else
    attention_bwd_delta_kernel<AnyIo><<<grid, 32 * kWarps, 0, stream>>>(p);
  launch_check("attention_bwd");
}

void launch_attention_bwd_tc(const AttentionParams& p, DType dt, cudaStream_t stream) {
  launch_attention_bwd_delta(p, stream);
  if (dt == DType::kBF16)
    launch_bwd_dtype<__nv_bfloat16>(p, stream);
  else
    launch_bwd_dtype<__half>(p, stream);
}

}  // namespace loom::kernels::cuda
