// MultiTokenPrediction (internal module of the GPT model, child "mtp"): DeepSeek-V3 /
// Megatron-Core multi-token prediction (core/transformer/multi_token_prediction.py), D =
// mtp_num_layers sequential depths on top of the main decoder. Depth k = 1..D, with h^0 the
// decoder's output after the model's final norm:
//   e_k   = Embed(ids rolled left k)                   shared word table (B, T, C)
//   u_k   = [enorm(e_k) ; hnorm(h^{k-1})] @ eh_proj     embedding first, then hidden
//   h^k   = final_layernorm(transformer_layer(u_k))
//   L_k   = sum(mask_k * CE(h^k W_out^T, labels_k)) / sum(mask_k)   (0 when all masked)
//   L_MTP = (lambda / D) * sum_k L_k
// where labels_k / mask_k are the labels and loss mask rolled left k positions, zero-filled
// (position i predicts t_{i+k+1}; the last k positions are masked), and W_out is the
// model's output weight (the word table when tied). With segment ids (packed documents) a
// position whose rolled token lies in another document is masked too (Megatron's packed
// roll). The transformer layer sees the model's position ids unrolled (Megatron passes the
// decoder's rotary table to the MTP layers); learned absolute positions are refused.
// Parameters (per depth j = k - 1, Megatron-Core's names under the model's "mtp."):
//   layers.j.enorm.weight, layers.j.hnorm.weight, layers.j.final_layernorm.weight: the
//     model's "final_norm" node kind (C);
//   layers.j.eh_proj.weight (2C, C): stored input-major, rows [0, C) act on the normalised
//     embedding, rows [C, 2C) on the normalised hidden state; Megatron's linear_fc weight is
//     (C, 2C) = this transposed (a checkpoint converter transposes it);
//   layers.j.transformer_layer.*: the model's "layer" node, built with layer_number
//     num_layers + k (the MTP layers are not FP8; a mixture-of-experts model's MTP layer
//     takes the last decoder layer's mlp kind, as Megatron's spec does).
// The word table and the output weight are the model's own (Embedding, OutputLayer): this
// module runs their ops itself on the same tensors (a module's saves are keyed by owner,
// so calling those children twice in one pass would overwrite theirs) and accumulates into
// the same gradients; its backward must run before the output layer's and the
// embedding's (their grads_ready follow their own backward).
//   forward (training only; the model skips it outside training):
//     [0] tokens (B, T) i32, [1] labels (B, T) i32, [2] loss mask (B, T) f32 or empty,
//     [3] position ids (B, T) i32 or empty, [4] segment ids (B, T) i32 or empty,
//     [5] h^0 (B, T, C), or the sequence shard (B, T/P, C) with sequence parallelism
//     -> [0] L_MTP f32 scalar (already scaled by lambda / D)
//   reports "mtp_loss" (L_MTP) and "mtp/loss/depth_k" (L_k, unscaled), MetricReduce::kMean.
//   backward: no gradient outputs (the loss is the module's own: its gradient is seeded
//     with the context's aux_loss_weight, as the MoE router's aux loss) -> [0] d h^0, the
//     shape of input [5]; parameter gradients accumulated (word table, output weight too).
// Tensor parallelism: the embedding lookup and the output GEMM are vocab-parallel with the
// model's (partial lookups summed, reduce-scattered to the sequence shard with sequence
// parallelism; vocab-parallel cross entropy through shard statistics). eh_proj and the
// norms are replicated; with sequence parallelism their inputs are sequence shards, so
// their gradients are partial and flagged kParamSequenceParallel (summed over tp).
// Pipeline and context parallelism are refused by the model (GptConfig, GptModel).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "plugins/transformer/embedding.h"
#include "plugins/transformer/gpt_config.h"
#include "plugins/transformer/output_layer.h"
#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class MultiTokenPrediction final : public ModuleBase<IGenericModule> {
 public:
  /// \param ctx        the model's build context ("layer" and "final_norm" are its nodes)
  /// \param config     the model's (mtp_num_layers >= 1)
  /// \param embedding  the model's embedding (the shared word table and its gradient)
  /// \param output     the model's output layer (the shared output weight and gradient)
  MultiTokenPrediction(IBuildContext& ctx, const GptConfig& config, const Embedding& embedding,
                       const OutputLayer& output);

 private:
  // Per depth: the children and the eh_proj parameter.
  struct Depth {
    IModule *enorm, *hnorm, *layer, *final_norm;
    int32_t eh_proj;
  };
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;
  // Depth j's forward from h^{k-1} to h^k (a new tensor), saving what its backward needs.
  TensorView depth_forward(IForwardContext& ctx, int32_t j, const TensorView& ids,
                           const TensorView& positions, const TensorView& segments,
                           const TensorView& h);
  // The vocab-parallel loss L_k of h^k (saves the logits and lse); returns L_k on the host.
  double loss_forward(IForwardContext& ctx, int32_t j, const TensorView& h,
                      const TensorView& labels, const TensorView& mask);
  // d h^k of L_k seeded with `dmean` (a device scalar), accumulating the output weight's
  // gradient; a new tensor shaped like h^k.
  TensorView loss_backward(IForwardContext& ctx, int32_t j, const TensorView& dmean);
  // Depth j's backward from d h^k to d h^{k-1} (a new tensor), accumulating the word
  // table's and the depth's parameters' gradients.
  TensorView depth_backward(IForwardContext& ctx, int32_t j, const TensorView& dh);
  // Slot of depth j's save `what`.
  static int32_t slot(int32_t j, int32_t what);

  GptConfig config_;
  IHost& host_;
  const Embedding& embedding_;
  const OutputLayer& output_;
  TensorParallel tp_;
  int64_t local_vocab_, vocab_start_;
  std::vector<Depth> depths_;
  Kernel embed_fwd_, embed_bwd_, gemm_, add_, dropout_fwd_, dropout_bwd_;
  Kernel loss_fwd_, loss_bwd_, shard_stats_, combine_;
};

}  // namespace loom::transformer
