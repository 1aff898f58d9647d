// Kinds built on IModule whose calling conventions are fixed by position and shape.
//
// B = micro-batch size, T = sequence length (local to a CP rank), C = hidden size,
// H = attention heads (local to a TP rank), G = query groups, D = head dim, V = vocabulary.
#pragma once

#include "loom/kinds/module.h"

namespace loom {

/// kinds::kModel. The whole network: tokens in, loss out.
///   forward inputs:  [0] tokens (B, T) i32, [1] labels (B, T) i32, [2] loss mask (B, T) f32,
///                    [3] position ids (B, T) i32 (optional: data == null for 0..T-1),
///                    [4] segment ids (B, T) i32 (optional: data == null for one segment;
///                        a token attends only to earlier tokens of its own segment)
///   forward outputs: [0] loss, scalar f32 (mean over unmasked tokens of this micro-batch),
///                    [1] logits (B, T, V) when the model was built to return them, else empty
///   backward:        grad_outputs[0] is d(total loss)/d(loss), scalar; no grad inputs.
class IModel : public IModule {
 protected:
  ~IModel() = default;
};

/// kinds::kLayer. One transformer (or hybrid) layer: (B, T, C) -> (B, T, C).
///   forward inputs: [0] hidden, [1] position ids (B, T) i32 or empty,
///                   [2] segment ids (B, T) i32 or empty (attention stays in a segment)
class ILayer : public IModule {
 protected:
  ~ILayer() = default;
};

/// kinds::kModule. Any other module (embedding, linear, output layer, ...); its factory
/// documents its inputs and outputs.
class IGenericModule : public IModule {
 protected:
  ~IGenericModule() = default;
};

/// kinds::kNorm. (..., C) -> (..., C), normalised over the last dimension.
class INorm : public IModule {
 protected:
  ~INorm() = default;
};

/// kinds::kMlp. (B, T, C) -> (B, T, C); dense or, for MoE, the experts behind a router.
class IMlp : public IModule {
 protected:
  ~IMlp() = default;
};

}  // namespace loom
