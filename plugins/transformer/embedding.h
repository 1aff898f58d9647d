// Embedding (internal module of the GPT model, child "embedding"): Megatron's
// LanguageModelEmbedding, word embeddings plus learned position embeddings (when the model
// uses them), then embedding dropout (hidden_dropout).
// Parameters: word_embeddings.weight (Vp, C), split over TP by vocabulary rows, Vp the padded
// vocabulary (rows from V on are padding: ParamInfo::valid_rows, never looked up);
// position_embeddings.weight (P, C) with learned positions.
//   forward:  [0] tokens (B, T) i32, [1] position ids (B, T) i32 or empty (0..T-1)
//             -> [0] (B, T, C), or the sequence shard (B, T/P, C) with sequence parallelism
//   backward: d(output) -> no input gradients; embedding gradients accumulated (in
//             backward_weight when the context defers weight gradients)
// Tensor parallelism (Megatron's VocabParallelEmbedding): rank r holds vocabulary rows
// [r Vp/P, (r + 1) Vp/P) and looks up only those (zero rows for other tokens); the partial
// sums are all-reduced (reduce-scattered to the sequence shard with sequence parallelism).
// The position table is replicated; rank 0 adds it before the sum, so its gradient, which
// only rank 0 computes, is summed over the group (flagged kParamSequenceParallel).
#pragma once

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

struct EmbeddingConfig {
  int64_t vocab_size, hidden_size, max_positions;  // max_positions 0: no position table
  /// Rows of the word table (and of a tied output layer): vocab_size, or more with padding
  /// rows after the vocabulary's (GptConfig::padded_vocab_size), a multiple of tp.
  int64_t padded_vocab_size;
  float init_std, dropout;
  bool tied;  // the word embeddings are shared with the output layer
  DType dtype;
  Device device;
  bool sequence_parallel = false;  // activations after the embedding are sequence shards
  /// Only the word table, never run: the last pipeline stage's copy of a table tied to its
  /// output layer (the same parameter name as the first stage's, so both start equal).
  bool table_only = false;
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
  // Zero-bubble split: the whole backward is weight gradients, so all of it waits for
  // backward_weight.
  bool defers_weight_grads() const override { return !config_.table_only; }
  void run_backward_weight(IForwardContext& ctx) override;
  // The table gradients from the output's gradient (B, T or T/P, C).
  void weight_grads(IForwardContext& ctx, const TensorView& grad_output, const TensorView& tokens,
                    const TensorView& positions);
  // Row range [0, t) of a (P, C) table: the default positions 0..T-1.
  TensorView first_rows(const TensorView& table, int64_t t) const;

  EmbeddingConfig config_;
  TensorParallel tp_;
  int32_t cp_rank_ = 0, cp_size_ = 1;  // the context-parallel group (dropout follows the chunks)
  int64_t vocab_start_ = 0;            // first vocabulary row of this rank's table
  bool sharded_ = false;               // split over tp or padded: lookups take EmbeddingAttrs
  int32_t word_, position_ = -1;
  Kernel embed_fwd_, embed_bwd_, add_, bias_add_, bias_grad_, dropout_fwd_, dropout_bwd_;
};

}  // namespace loom::transformer
