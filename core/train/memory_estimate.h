// The analytic memory estimate of a training run, to set beside the measured peak: weights,
// f32 gradients, f32 master weights, optimizer states, and the activations at the peak of
// one micro-batch.
//
// Activations follow what the shipped transformer plugin's modules keep (they hand every
// other tensor back to the forward context as soon as it is consumed). With n = B * T
// tokens of the micro-batch on this rank, s the parameter dtype's size, C the hidden size,
// Hl / Gl the query heads / key-value groups and Fl the MLP width on this rank (each divided
// by tp), D the head dimension and Vl the vocabulary on this rank, each layer saves for
// backward (recompute "none"):
//     layer input, its normalised form, the attention output, the residual and the MLP
//     input:                                5 n C s        (C = Hl D for the output: n Hl D s)
//     fused attention: q, k, v and the row log-sum-exp: n (Hl + 2 Gl) D s + 4 n Hl
//     dot_product attention: head-major q, k, v and the probabilities:
//                                           n (Hl + 2 Gl) D s + B Hl T^2 s (not "selective")
//     MLP: fc1 output (Fl, or 2 Fl for swiglu) and activation output (Fl): n (fc1 + Fl) s
//     the two norms' statistics (f32): layernorm 2 x 2 x 4 n, rmsnorm 2 x 4 n
// and with recompute "full" only its input, n C s. With FP8 GEMMs (/precision/fp8) each of
// the layer's four linear sites (qkv, proj, fc1, fc2) keeps its input's and its weight's
// FP8 transposes, one byte an element: n (2 C + Hl D + Fl) + C ((Hl + 2 Gl) D + Hl D + fc1 +
// Fl) bytes per layer; and the layer no longer keeps the normalised input, the MLP input and
// the activation output in the parameter dtype, nor the attention output unless the
// attention core keeps it (fused does, for its backward): n (2 C + Fl (+ Hl D)) s less. The
// model's num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16 layers are not FP8. After the
// last layer come the final norm's input and output, its statistics, the logits n Vl s and their
// log-sum-exp 4 n. The peak is reached when backward starts, with the logits' gradient (n Vl s)
// beside all of that, or inside the top layer's MLP backward when that is larger (dy, da, d(fc1
// out), dx: n (2 C + Fl + fc1) s, plus n C s for hidden dropout). Not counted: kernel workspaces,
// the batch's ids, the RoPE table and the allocator's rounding, which is why the estimate is meant
// to be within 10%, not exact.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "loom/kinds/module.h"
#include "loom/types.h"

namespace loom::core {

/// Bytes by category. activations is empty when the model is not one the formula knows.
struct MemoryEstimate {
  uint64_t weights = 0;
  uint64_t grads = 0;
  uint64_t master = 0;
  uint64_t optimizer = 0;
  uint64_t fp8 = 0;  ///< the FP8 recipe's state (amax histories, scales)
  std::optional<uint64_t> activations;

  /// The sum (activations counted as 0 when unknown).
  uint64_t total() const;
  /// "2.31 GiB: weights 0.46, grads 0.46, master 0, optimizer 0.93, activations 0.46 GiB"
  /// (", fp8 state 0.01" before the activations when there is one).
  std::string describe() const;
};

/// What a micro-batch's activations depend on, besides the model node.
struct ActivationShape {
  int64_t micro_batch = 1;
  int64_t seq_length = 1;
  int64_t tp = 1;
  bool sequence_parallel = false;  ///< layer-boundary tensors are sequence shards
  DType dtype = DType::kF32;       ///< the parameters' (and activations') dtype
  RecomputePolicy recompute = RecomputePolicy::kNone;
  bool fp8 = false;  ///< the layers' GEMMs run in FP8 (their operands' transposes are kept)
};

/// Peak activation bytes of one micro-batch's forward and backward (the formula above) for
/// the spec's model node (resolved: defaults filled in), or empty when the model is not the
/// transformer plugin's "gpt" with its own layer, norms, attention cores and MLP.
std::optional<uint64_t> transformer_activation_bytes(const nlohmann::json& model,
                                                     const ActivationShape& shape);

}  // namespace loom::core
