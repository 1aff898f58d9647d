// Device code of split_qkv / merge_qkv's copy (qkv.cu has the ops' contract and the launch),
// in a header so that tests/kernels/cuda/pointwise_emulation runs it on the CPU.
//
// X (B T, G, (H/G + 2) D) in units of U (16, 8, 4 or 2 bytes; per_head units a head): the
// span = (H/G + 2) per_head units of one (token, group) tg = t G + g are contiguous, and
// unit w of it is slot w / per_head of the group (H/G query heads, then the key head, then
// the value head), unit w % per_head of that head. Query slot s of tg is query head
// t H + g H/G + s = tg H/G + s of Q (B T, H, D); the key and value heads are head tg of K
// and V (B T, G, D).
//
// One thread per unit of X, 256 threads a block, grid-striding. I is the index type:
// uint32_t when X has fewer than 2^31 units (the launcher's choice; then no index and no
// stride step can pass 2^32), else int64_t. Two divisions a unit, by span and by per_head:
// 32-bit ones in the common case. (The H200 profile of 2026-11-27 showed the former kernel,
// four 64-bit divisions a unit, at ~3.2 TB/s: bound by its index arithmetic.)
#pragma once

#include <stdint.h>

namespace loom::kernels::cuda::pointwise {

// merge: X from Q, K, V; else (split) Q, K, V from X.
template <class U, class I>
__global__ void qkv_copy_kernel(U* x, U* q, U* k, U* v, I n, I per_head, I q_per_g, bool merge) {
  const I span = (q_per_g + 2) * per_head;
  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       i < n; i += step) {
    const I tg = i / span, w = i - tg * span;              // X's (token, group), unit within it
    const I slot = w / per_head, u = w - slot * per_head;  // head of the group, unit within it
    U* other = slot < q_per_g ? q + (tg * q_per_g + slot) * per_head + u
                              : (slot == q_per_g ? k : v) + tg * per_head + u;
    if (merge)
      x[i] = *other;
    else
      *other = x[i];
  }
}

}  // namespace loom::kernels::cuda::pointwise
