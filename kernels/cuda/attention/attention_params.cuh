// What the attention launchers share: the flattened arguments of one attention_fwd /
// attention_bwd call (AttentionParams), the workspace layout of attention_bwd, and the
// launchers of the tensor-core kernels (attention_fwd.cu, attention_bwd.cu) and of the
// generic kernels (attention_generic.cu), which attention.cu picks between.
#pragma once

#include <cuda_runtime.h>
#include <loom/types.h>
#include <stdint.h>

namespace loom::kernels::cuda {

/// Strides (in elements) of the rows of a (B, rows, heads, D) tensor: row (b, t, h) starts
/// at b * b_ + t * t_ + h * h_ and its D elements are packed (op_checks::RowStrides, whose
/// offsets the kernels need on the device). Q, K, V, dQ, dK and dV may be such views, e.g.
/// of one fused (B, T, H, 3 D) QKV projection (loom/cpp/nn/qkv_views.h); O, dO and lse are
/// packed.
struct RowStrides {
  int64_t b_, t_, h_;
  __host__ __device__ __forceinline__ int64_t at(int64_t b, int64_t t, int64_t h) const {
    return b * b_ + t * t_ + h * h_;
  }
  /// Those of a packed (B, T, H, D) tensor.
  __host__ __device__ static constexpr RowStrides packed(int64_t t, int64_t h, int64_t d) {
    return {t * h * d, h * d, d};
  }
};

/// One call's tensors and attributes. Pointers are device pointers; unused ones are null
/// (the forward's leave the backward's null and the other way round).
struct AttentionParams {
  // Forward and backward inputs.
  const void* q;        // (B, T, H, D)
  const void* k;        // (B, S, G, D)
  const void* v;        // (B, S, G, D)
  const int32_t* seg;   // (B, T) or null: the queries' segment ids
  const int32_t* kseg;  // (B, S): the keys' segment ids (seg itself when the call has none, T == S)
  // Forward outputs.
  void* o;     // (B, T, H, D)
  float* lse;  // (B, H, T)
  // Backward inputs and outputs.
  const void* dout;     // dO (B, T, H, D)
  const void* out;      // O (B, T, H, D)
  const float* lse_in;  // (B, H, T)
  void* dq;             // (B, T, H, D)
  void* dk;             // (B, S, G, D)
  void* dv;             // (B, S, G, D)
  float* dq_acc;        // (B, T, H, D) f32 workspace of the tensor-core backward, else null
  float* delta;         // (B, H, T) f32 workspace: rowsum(dO * O)
  // Row strides of the views above (dq_rows, dk_rows, dv_rows in the backward only); the
  // workspaces dq_acc and dkv_acc are packed whatever dQ, dK and dV are.
  RowStrides q_rows, k_rows, v_rows, dq_rows, dk_rows, dv_rows;
  // Tensor-core backward: blocks per (key tile, b, g), each over its share of the group's
  // query heads (attention_bwd_head_splits). With more than one, each block writes its
  // partial dK, dV into dkv_acc, (head_splits, 2, B, S, G, D) f32, and a last kernel sums
  // the splits in order; with one (or 0, the same), into dk and dv directly.
  int64_t head_splits;
  float* dkv_acc;

  int64_t b, t, s, h, g, d;
  int64_t group;  // H / G: query heads per key/value head

  // The dropout index's frame (AttentionBlockAttrs): element (b, h, t, s) draws number
  // ((b H + h) q_total + q_offset + t) k_total + k_offset + s; 0, 0, T, S for a whole call.
  int64_t q_offset, k_offset, q_total, k_total;

  float scale;
  int32_t causal;
  int32_t dropout;     // 1 when dropout_p > 0
  uint32_t threshold;  // Philox keep threshold of dropout_p (loom/cpp/philox.h)
  float keep_scale;    // 1 / (1 - dropout_p)
  uint64_t key, counter;

  // Storage dtypes, read by the generic kernels when the tensors' dtypes differ.
  DType dt_q, dt_k, dt_v, dt_o, dt_do, dt_dq, dt_dk, dt_dv;
};

/// Keys per block of the tensor-core backward (BwdTile::kBc for both head dims).
inline constexpr int64_t kAttentionBwdKeysPerBlock = 64;

/// Blocks per (key tile, b, g) of the tensor-core backward on a GPU of `sm_count`
/// multiprocessors: 1 while the (key tile, b, g) blocks alone give every multiprocessor
/// two (two fit at once), else enough to get there, up to one per query head of the group
/// (MQA or few groups, a small batch, short sequences), each split over the same number of
/// heads but the last.
inline int64_t attention_bwd_head_splits(const AttentionParams& p, int64_t sm_count) {
  const int64_t blocks =
      (p.s + kAttentionBwdKeysPerBlock - 1) / kAttentionBwdKeysPerBlock * p.b * p.g;
  const int64_t want = 2 * sm_count;
  if (blocks == 0 || p.group <= 1 || blocks >= want) return 1;
  int64_t splits = (want + blocks - 1) / blocks;
  if (splits > p.group) splits = p.group;
  const int64_t heads = (p.group + splits - 1) / splits;  // per split
  return (p.group + heads - 1) / heads;                   // no split left without a head
}

/// attention_bwd's workspace: dq_acc (B, T, H, D) f32 for the tensor-core path (0 bytes
/// otherwise), then dkv_acc (head_splits, 2, B, S, G, D) f32 when the tensor-core path
/// splits the heads (0 bytes otherwise), then delta (B, H, T) f32. Every region is a
/// multiple of 8 bytes when D is even, so the next stays aligned.
inline uint64_t attention_bwd_dq_acc_bytes(const AttentionParams& p, bool tensor_cores) {
  return tensor_cores ? static_cast<uint64_t>(p.b * p.t * p.h * p.d) * 4u : 0u;
}
inline uint64_t attention_bwd_dkv_acc_bytes(const AttentionParams& p, bool tensor_cores) {
  return tensor_cores && p.head_splits > 1
             ? static_cast<uint64_t>(p.head_splits * 2 * p.b * p.s * p.g * p.d) * 4u
             : 0u;
}
inline uint64_t attention_bwd_delta_bytes(const AttentionParams& p) {
  return static_cast<uint64_t>(p.b * p.h * p.t) * 4u;
}

/// Head dims the tensor-core kernels are instantiated for.
inline bool attention_tc_head_dim(int64_t d) { return d == 64 || d == 128; }

/// Largest head dim of the tiled generic kernels (attention_tiled_kernel.cuh); the
/// warp-per-row ones take larger head dims, and any call whose tiles do not fit in a block's
/// shared memory.
inline constexpr int64_t kAttentionTiledMaxD = 128;

/// Largest head dim of the generic kernels: a few D-float rows per warp live in shared
/// memory (attention_generic.cu), and at least one warp must fit in a block.
inline constexpr int64_t kAttentionGenericMaxD = 4096;

// Tensor-core kernels: Q, K, V, O (dO, dQ, dK, dV) all of dtype `dt` (bf16 or f16), D in
// {64, 128}, every pointer 16-byte aligned and every row stride a multiple of 8 elements
// (so is every row: cp.async and the vector stores move 16 bytes). Throw loom::Error on a
// launch failure.
void launch_attention_fwd_tc(const AttentionParams& p, DType dt, cudaStream_t stream);
void launch_attention_bwd_tc(const AttentionParams& p, DType dt, cudaStream_t stream);

// Generic kernels: any float dtypes (per tensor, p.dt_*), any D <= kAttentionGenericMaxD,
// any pointers and row strides (element accesses only).
// The backward needs p.delta; it does not use p.dq_acc.
void launch_attention_fwd_generic(const AttentionParams& p, cudaStream_t stream);
void launch_attention_bwd_generic(const AttentionParams& p, cudaStream_t stream);

// delta = rowsum(dO * O) into p.delta, and p.dq_acc zeroed when not null (attention_bwd.cu).
void launch_attention_bwd_delta(const AttentionParams& p, cudaStream_t stream);

}  // namespace loom::kernels::cuda
