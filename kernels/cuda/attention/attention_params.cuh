// What the attention launchers share: the flattened arguments of one attention_fwd /
// attention_bwd call (AttentionParams), the workspace layout of attention_bwd, and the
// launchers of the tensor-core kernels (attention_fwd.cu, attention_bwd.cu) and of the
// generic kernels (attention_generic.cu), which attention.cu picks between.
#pragma once

#include <cuda_runtime.h>
#include <loom/types.h>
#include <stdint.h>

namespace loom::kernels::cuda {

/// One call's tensors and attributes. Pointers are device pointers; unused ones are null
/// (the forward's leave the backward's null and the other way round).
struct AttentionParams {
  // Forward and backward inputs.
  const void* q;       // (B, T, H, D)
  const void* k;       // (B, S, G, D)
  const void* v;       // (B, S, G, D)
  const int32_t* seg;  // (B, T) or null; T == S when present
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

  int64_t b, t, s, h, g, d;
  int64_t group;  // H / G: query heads per key/value head

  float scale;
  int32_t causal;
  int32_t dropout;     // 1 when dropout_p > 0
  uint32_t threshold;  // Philox keep threshold of dropout_p (philox.cuh)
  float keep_scale;    // 1 / (1 - dropout_p)
  uint64_t key, counter;

  // Storage dtypes, read by the generic kernels when the tensors' dtypes differ.
  DType dt_q, dt_k, dt_v, dt_o, dt_do, dt_dq, dt_dk, dt_dv;
};

/// attention_bwd's workspace: dq_acc (B, T, H, D) f32 for the tensor-core path (0 bytes
/// otherwise), then delta (B, H, T) f32. Both regions are multiples of 8 bytes when D is
/// even, so delta stays aligned.
inline uint64_t attention_bwd_dq_acc_bytes(const AttentionParams& p, bool tensor_cores) {
  return tensor_cores ? static_cast<uint64_t>(p.b * p.t * p.h * p.d) * 4u : 0u;
}
inline uint64_t attention_bwd_delta_bytes(const AttentionParams& p) {
  return static_cast<uint64_t>(p.b * p.h * p.t) * 4u;
}

/// Head dims the tensor-core kernels are instantiated for.
inline bool attention_tc_head_dim(int64_t d) { return d == 64 || d == 128; }

/// Largest head dim of the generic kernels: a few D-float rows per warp live in shared
/// memory (attention_generic.cu), and at least one warp must fit in a block.
inline constexpr int64_t kAttentionGenericMaxD = 4096;

// Tensor-core kernels: Q, K, V, O (dO, dQ, dK, dV) all of dtype `dt` (bf16 or f16), D in
// {64, 128}, every pointer 16-byte aligned. Throw loom::Error on a launch failure.
void launch_attention_fwd_tc(const AttentionParams& p, DType dt, cudaStream_t stream);
void launch_attention_bwd_tc(const AttentionParams& p, DType dt, cudaStream_t stream);

// Generic kernels: any float dtypes (per tensor, p.dt_*), any D <= kAttentionGenericMaxD.
// The backward needs p.delta; it does not use p.dq_acc.
void launch_attention_fwd_generic(const AttentionParams& p, cudaStream_t stream);
void launch_attention_bwd_generic(const AttentionParams& p, cudaStream_t stream);

// delta = rowsum(dO * O) into p.delta, and p.dq_acc zeroed when not null (attention_bwd.cu).
void launch_attention_bwd_delta(const AttentionParams& p, cudaStream_t stream);

// Sets the dynamic shared-memory limit of `kernel` when a block needs more than 48 KB
// (attention.cu).
void attention_allow_smem(const void* kernel, size_t bytes, const char* op);

}  // namespace loom::kernels::cuda
