// Kinds built on IModule whose calling conventions are fixed by position and shape.
//
// B = micro-batch size, T = sequence length (local to a CP rank), C = hidden size,
// H = attention heads (local to a TP rank), G = query groups, D = head dim, V = vocabulary.
#pragma once

#include "loom/kinds/module.h"

namespace loom {

/// What a model is and where it sits in a pipeline (IModel::info, model 1.1).
///
/// A model may be built as one pipeline stage: the core hands its factory the inherited
/// option "pipeline" = {"rank": r, "size": P, "chunk": c, "chunks": V} (this rank's stage,
/// and its virtual chunk with interleaved schedules: chunk c of rank r is virtual stage
/// c * P + r of P * V); without it the model is the whole network (rank 0 of 1, chunk 0 of
/// 1). The model decides which of its layers the stage owns (an even split, or a layout of
/// its own options) and says so here; the first virtual stage holds the input embedding, the
/// last the output layer and the loss.
struct ModelInfo {
  uint32_t struct_size;  ///< sizeof(ModelInfo) of the caller; the model fills what it knows
  int64_t vocab_size;    ///< V: token ids and labels lie in [0, V)
  int64_t num_layers;    ///< layers of the whole network
  /// The sequence length the model is meant for (its position table, or what it was built
  /// for): how long a generated sequence may grow by default.
  int64_t max_sequence;
  int32_t positions_bounded;  ///< 1: it cannot run past max_sequence (learned positions)
  int64_t layer_begin;        ///< the layers this stage owns: [layer_begin, layer_end)
  int64_t layer_end;
  int32_t pp_rank, pp_size;  ///< the pipeline stage it was built as (0 of 1: whole network)
  int32_t chunk, chunks;     ///< its virtual chunk (0 of 1 without interleaving)
  int32_t first_stage;       ///< 1: takes tokens (forward input [0]); 0: takes hidden ([5])
  int32_t last_stage;        ///< 1: gives the loss (outputs [0], [3], [4]); 0: hidden ([2])
  /// The activation between two stages for one micro-batch on this rank: dtype and shape,
  /// data null; e.g. (B, T, C), or (B, T/tp, C) with sequence parallelism. What a receive
  /// buffer is allocated as.
  TensorView hidden;
};

/// The shapes a cost query is about (IModel::cost).
struct CostQuery {
  uint32_t struct_size;
  int64_t micro_batch;        ///< B
  int64_t seq_length;         ///< T, the whole sequence
  RecomputePolicy recompute;  ///< the policy of the training contexts
  /// 1 when the run trains in FP8 (its recipe was handed over); 2 (from ABI 1.18) when, in
  /// addition, the training contexts give a param_version (forward_context 1.9) under which
  /// nn::Linear keeps its FP8 weights for the step's other micro-batches: held once, for the
  /// whole run, instead of in each micro-batch's activations. A model that knows only 1
  /// treats any nonzero value as 1.
  int32_t fp8;
};

/// What a model costs (IModel::cost): how the core counts model FLOPs for MFU and
/// estimates activation memory, without knowing the model's options.
struct ModelCost {
  uint32_t struct_size;
  /// Model FLOPs of forward and backward per token of the whole network (every rank's share
  /// together, recomputation not counted): 6 per parameter plus attention's, as Megatron and
  /// llm.c count them. <= 0 when unknown (the core then counts 6 per parameter).
  double flops_per_token;
  /// This rank's activation memory at its peak for one micro-batch in flight (what forward
  /// keeps for backward plus what backward holds at its largest), in bytes. < 0 when the
  /// model cannot tell.
  double activation_bytes;
};

/// kinds::kModel. The whole network, or one pipeline stage of it: tokens (or hidden) in,
/// loss (or hidden) out.
///   forward inputs:  [0] tokens (B, T) i32, [1] labels (B, T) i32, [2] loss mask (B, T) f32,
///                    [3] position ids (B, T) i32 (optional: data == null for 0..T-1),
///                    [4] segment ids (B, T) i32 (optional: data == null for one segment;
///                        a token attends only to earlier tokens of its own segment),
///                    [5] hidden in (ModelInfo::hidden), a stage that is not the first
///                        (model 1.1; the first stage takes none)
///   forward outputs: [0] loss, scalar f32 (mean over unmasked tokens of this micro-batch),
///                    [1] logits (B, T, V) when the model was built to return them, else empty
///                    (or (B, T, Vp), Vp > V: a padded vocabulary, whose columns from V on are
///                    padding, never sampled)
///                    [2] hidden out (ModelInfo::hidden), a stage that is not the last
///                    [3] loss sum, scalar f32: the sum of the unmasked tokens' losses
///                    [4] loss tokens, scalar f32: how many tokens were unmasked
///                    (model 1.1: [0], [3] and [4] from the last stage only, empty on others;
///                    the sum and count let pipeline stages and context-parallel ranks
///                    combine the loss exactly; a caller that asks for fewer outputs gets
///                    fewer)
///   backward:        grad_outputs[0] is d(total loss)/d(loss) (last stage; weighting the sum
///                    by w is grad w * tokens), [1] an optional logits gradient, [2] the
///                    gradient of hidden out (a stage that is not the last); grad_inputs[5]
///                    receives the gradient of hidden in (a stage that is not the first).
class IModel : public IModule {
 public:
  // ---- model 1.1 (ABI 1.5): check interface_info().minor >= 1 first. ----

  /// What the model is and which pipeline stage it was built as.
  /// \param[out] out  filled up to out->struct_size
  virtual Status info(ModelInfo* out) const noexcept = 0;
  /// Model FLOPs per token and activation memory for `query`'s shapes.
  /// \param query     the micro-batch's shapes and the run's recomputation
  /// \param[out] out  filled up to out->struct_size
  virtual Status cost(const CostQuery* query, ModelCost* out) const noexcept = 0;

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
///   forward inputs:  [0] x (..., C), [1] r (..., C) or absent (norm 1.2)
///   forward outputs: [0] y (..., C), [1] z (..., C) when r is given (norm 1.2)
///   backward:        grad_outputs [0] dy, [1] dz or absent (norm 1.2); grad_inputs [0] dx
/// Norm 1.2 fuses a pre-norm layer's residual add into the norm: given r, the norm is of
/// z = x + r (rounded to the dtype), and z, the next residual, is output [1] (the caller asks
/// for two outputs). In backward, dz is the gradient that reaches the norm's input (z, or x
/// without r) by its other path: grad_inputs[0] is the input's whole gradient, the norm's
/// plus dz, which is x's and r's alike (further grad inputs are empty). A 1.0 or 1.1 norm
/// ignores what it does not know: check interface_info().minor >= 2 before passing r or dz.
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
