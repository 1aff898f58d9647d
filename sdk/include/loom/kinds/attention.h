// kinds::kAttention: the attention core, swappable by spec (reference dot-product, fused /
// flash, ring attention for CP). Projections live in the layer, not here.
//
//   forward inputs:  [0] q (B, T, H, D), [1] k (B, S, G, D), [2] v (B, S, G, D)
//                    [3] segment ids (B, T) i32 or empty: tokens attend only within their
//                        segment (document resets); [4] optional additive bias or empty
//   forward outputs: [0] out (B, T, H, D)
//   backward:        grad of out -> grads of q, k, v
// H must be a multiple of G (MHA: G == H, MQA: G == 1). Causality, softmax scale, window
// and dropout are options of the factory.
//
// attention 1.2 (ABI 1.10), a calling convention: q, k, v are packed, or (MHA) the three
// strided views of one fused QKV tensor that loom::nn::fused_qkv_views makes
// (loom/cpp/nn/qkv_views.h); a caller passes such views only to a module whose
// interface_info() says 1.2 or later. The module reads them in place or copies them, as it
// needs. Its backward may then return the gradients of q, k, v as the same views of one new
// allocation (loom::nn::fused_qkv_of(dq, dk, dv) is not empty): the caller releases that
// allocation once. Otherwise they are three packed allocations, as in 1.1.
#pragma once

#include "loom/kinds/module.h"

namespace loom {

class IAttention : public IModule {
 protected:
  ~IAttention() = default;
};

}  // namespace loom
