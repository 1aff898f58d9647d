// Multi-latent attention (DeepSeek-V2/V3, Megatron-Core's MLASelfAttention): the layout ops
// between its projections and an attention core that takes one head dim for q, k and v. Part
// of the op catalogue: loom/ops.h states the conventions every op follows (layouts, dtypes,
// "+=" outputs, the random stream) and includes every family.
//
// B = batch, T = tokens, H = heads, dn = qk_head_dim (the part without positions), dr =
// qk_pos_emb_head_dim (the decoupled rotary part), dv = v_head_dim, D = dr + dn (the head dim
// of q and k, and of v padded with zeros), dv <= D.
#pragma once

#include <stdint.h>

namespace loom::ops {

// ---------------------------------------------------------------------------------------
// Multi-latent attention
// ---------------------------------------------------------------------------------------

/// "mla_qkv": assembles each head's q, k and v from the up-projections (Megatron's per-head
/// layouts: q as [q_nope, q_pe], kv as [k_nope, v]) and the shared rotary key k_pe. The
/// rotary part goes first, so that rope_fwd with rotary_dim = dr rotates exactly it:
///   Q[b, t, h] = [q[b, t, h, dn : dn + dr], q[b, t, h, 0 : dn]]
///   K[b, t, h] = [kpe[b, t, :],             kv[b, t, h, 0 : dn]]      (k_pe shared by all heads)
///   V[b, t, h] = [kv[b, t, h, dn : dn + dv], zeros(D - dv)]
///   inputs:  [0] q float (B, T, H, dn + dr), [1] kv (B, T, H, dn + dv) q's dtype,
///            [2] kpe (B, T, dr) q's dtype
///   outputs: [0] Q (B, T, H, D), [1] K (B, T, H, D), [2] V (B, T, H, D), all q's dtype
/// "mla_qkv_bwd": the gradient (its transpose): dq = [dQ[dr : D], dQ[0 : dr]] per head,
/// dkv = [dK[dr : D], dV[0 : dv]] per head, dkpe[b, t] = sum over heads of dK[b, t, h, 0 : dr]
/// (in head order); dV's padding channels are not read.
///   inputs:  [0] dQ (B, T, H, D), [1] dK (B, T, H, D), [2] dV (B, T, H, D)
///   outputs: [0] dq (B, T, H, dn + dr), [1] dkv (B, T, H, dn + dv), [2] dkpe (B, T, dr)
///            (overwritten)
/// "mla_out": the first dv channels of each head of the core's output (the rest are the
/// zero padding of V): Y[b, t, h, :] = O[b, t, h, 0 : dv].
///   inputs: [0] O float (B, T, H, D)    outputs: [0] Y (B, T, H, dv)
/// "mla_out_bwd": dO = [dY, zeros(D - dv)] per head.
///   inputs: [0] dY (B, T, H, dv)        outputs: [0] dO (B, T, H, D)
/// All four take MlaAttrs (the shapes fix the rest).
inline constexpr const char* kMlaQkv = "mla_qkv";
inline constexpr const char* kMlaQkvBwd = "mla_qkv_bwd";
inline constexpr const char* kMlaOut = "mla_out";
inline constexpr const char* kMlaOutBwd = "mla_out_bwd";
struct MlaAttrs {
  int32_t nope_dim;  ///< dn >= 1
  int32_t rope_dim;  ///< dr >= 0 (even for rope)
  int32_t v_dim;     ///< dv in [1, dn + dr]
};

}  // namespace loom::ops
