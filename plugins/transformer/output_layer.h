// OutputLayer (internal module of the GPT model, child "output_layer"): logits = x W^T,
// with W (Vp, C) either its own parameter "weight" (split over TP by vocabulary rows) or,
// with tied embeddings, the word embedding table (gradients accumulate into that table's
// gradient; the layer then declares no parameter). Vp is the padded vocabulary
// (EmbeddingConfig::padded_vocab_size): W's rows from V on are padding, kept at 0, and
// their logits are left out of the loss (cross_entropy's padding columns) and sampling.
//   forward:  [0] x (B, T, C) -> [0] logits (B, T, Vp)
//   backward: dlogits -> dx; dW accumulated
// Tensor parallelism: column-parallel over the vocabulary; rank r computes the logits of
// its rows [r Vp/P, (r + 1) Vp/P) of W only, (B, T, Vp/P). With sequence parallelism x is the
// sequence shard (B, T/P, C), gathered first (and dx reduce-scattered).
#pragma once

#include "plugins/transformer/embedding.h"
#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class OutputLayer final : public ModuleBase<IGenericModule> {
 public:
  /// \param tied_to  the embedding whose word table is shared, or null for an own weight
  OutputLayer(IHost& host, const EmbeddingConfig& config, const Embedding* tied_to);
  /// The output weight (V/P, C) and its gradient: the own parameter's, or the tied word
  /// table's (multi-token prediction shares them).
  const TensorView& weight() const;
  const TensorView& weight_grad() const;

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  // Zero-bubble split: the weight gradient (into the tied table's, when tied) waits for
  // backward_weight.
  bool defers_weight_grads() const override { return true; }
  void run_backward_weight(IForwardContext& ctx) override;

  EmbeddingConfig config_;
  const Embedding* tied_to_;
  TensorParallel tp_;
  int64_t local_vocab_;
  int32_t weight_ = -1;
  Linear linear_;
};

}  // namespace loom::transformer
