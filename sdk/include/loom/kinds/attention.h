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
#pragma once

#include "loom/kinds/module.h"

namespace loom {

class IAttention : public IModule {
 protected:
  ~IAttention() = default;
};

}  // namespace loom
