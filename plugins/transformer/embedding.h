// Embedding (internal module of the GPT model, child "embedding"): Megatron's
// LanguageModelEmbedding, word embeddings plus learned position embeddings (when the model
// uses them), then embedding dropout (hidden_dropout).
// Parameters: word_embeddings.weight (V, C), split over TP by vocabulary rows;
// position_embeddings.weight (P, C) with learned positions.
//   forward:  [0] tokens (B, T) i32, [1] position ids (B, T) i32 or empty (0..T-1)
//             -> [0] (B, T, C)
//   backward: d(B, T, C) -> no input gradients; embedding gradients accumulated
#pragma once

#include "plugins/transformer/module_base.h"

namespace loom::transformer {

struct EmbeddingConfig {
  int64_t vocab_size, hidden_size, max_positions;  // max_positions 0: no position table
  float init_std, dropout;
  bool tied;  // the word embeddings are shared with the output layer
  DType dtype;
  Device device;
};

class Embedding final : public ModuleBase<IGenericModule> {
 public:
  Embedding(IHost& host, const EmbeddingConfig& config);
  /// The word embedding table and its gradient (for a tied output layer).
  const TensorView& word_weight() const { return value(word_); }
  const TensorView& word_grad() const { return grad(word_); }

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  // Row range [0, t) of a (P, C) table: the default positions 0..T-1.
  TensorView first_rows(const TensorView& table, int64_t t) const;

  EmbeddingConfig config_;
  int32_t word_, position_ = -1;
  Kernel embed_fwd_, embed_bwd_, add_, dropout_fwd_, dropout_bwd_;
};

}  // namespace loom::transformer
