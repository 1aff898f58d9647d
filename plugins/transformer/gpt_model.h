// GptModel (kinds::kModel "gpt"): a decoder-only language model in the shape of
// Megatron-Core's GPTModel: embedding, num_layers copies of the "layer" node, the final
// norm, the output layer (tied to the word embeddings or not) and the cross-entropy loss.
// GPT-2 (learned positions, LayerNorm, GELU) and LLaMA (RoPE, RMSNorm, SwiGLU, GQA, no
// biases, untied) are both configurations of it.
// Children: "embedding", "decoder.layers.<i>" (i from 0), "decoder.final_layernorm",
// "output_layer", and with mtp_num_layers > 0 "mtp" (multi-token prediction, mtp.h: its
// loss reported as the metric "mtp_loss" and added to what backward differentiates, the
// model's loss output staying the main loss; computed in training only); so parameters are
// named as in Megatron-Core's state dict.
//   forward/backward: kinds/model.h (tokens, labels, loss mask, position ids -> loss, logits).
//   backward also accepts grad_outputs[1], a gradient of the logits (B, T, V), added to the
//   loss's (for objectives beyond the loss; tests).
// Tensor parallelism: the embedding and the output layer are vocab-parallel, and so is the
// loss (Megatron's vocab-parallel cross entropy): each rank reduces its (N, V/P) logits to
// per-row statistics (cross_entropy_shard_stats), the statistics are all-gathered and
// combined into the loss (cross_entropy_combine), and each rank's logit gradient is its
// shard's. The logits output is then not available (return_logits is refused).
// Pipeline stages (model 1.1, kinds/model.h): built with the core's inherited "pipeline", the
// model owns an even share of the layers (GptConfig); the first virtual stage holds the
// embedding, the last the final norm, the output layer and the loss. A last stage that is not
// the first and ties its embeddings keeps its own copy of the word table under the
// embedding's name (so both copies start equal; their gradients are summed over the
// embedding group). Layers keep their global numbers in parameter names
// ("decoder.layers.<i>"), so checkpoints name the same tensor alike in every layout.
// Split backward: every weight-holding child defers its GEMMs' weight gradients when the
// context says so (backward_weight runs them, the output layer first, the embedding last).
// The loss in one pass: when the context gives the loss's gradient during the forward
// (IForwardContext::loss_grad, forward_context 1.7) and a kernel library serves
// cross_entropy_fwd_bwd (fuses_loss), the forward computes the logits' gradient too, in the
// logits' own memory, which backward then hands to the output layer: the logits are read
// once instead of twice, and no second (N, V) buffer is needed. Pinning the op to "none"
// (/kernels/pin) keeps the two ops; so does tensor parallelism (the vocab-parallel loss),
// context parallelism (no gradient before the forward) and return_logits.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "plugins/transformer/embedding.h"
#include "plugins/transformer/gpt_config.h"
#include "plugins/transformer/mtp.h"
#include "plugins/transformer/output_layer.h"
#include "plugins/transformer/toolkit.h"

namespace loom::transformer {

class GptModel final : public ModuleBase<IModel> {
 public:
  GptModel(const nlohmann::json& options, IBuildContext& ctx);

  Status info(ModelInfo* out) const noexcept override;
  Status cost(const CostQuery* query, ModelCost* out) const noexcept override;

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  // The loss's backward down to the final norm's input gradient (the last stage).
  TensorView loss_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                           int32_t num_grad_outputs);
  // True when a training forward with the context's loss_grad computes the logits' gradient
  // too (cross_entropy_fwd_bwd, in place): one tensor-parallel rank, one context-parallel
  // rank, no logits returned, and a kernel that serves the op.
  bool fuses_loss() const;
  // Activation bytes of one micro-batch at its peak (gpt_cost.cc), or < 0 when a child's
  // impl is not one whose memory it knows.
  double activation_bytes(const CostQuery& query) const;
  // True when this stage's FP8 MLPs quantise fc1's output gradient in swiglu's kernel
  // (Mlp::quantizes_swiglu_grad; every FP8 dense layer's MLP has one configuration).
  bool quantizes_swiglu_grad() const;

  GptConfig config_;
  nlohmann::json options_;  // the node as built (the children's impls, for cost)
  TensorParallel tp_;
  int32_t cp_size_ = 1;   // context-parallel ranks: each holds seq_length / cp_size_ tokens
  int32_t ep_size_ = 1;   // expert-parallel ranks (a mixture of experts' routed rows, for cost)
  int32_t etp_size_ = 1;  // expert-tensor-parallel ranks (the experts' split, for cost)
  Embedding* embedding_ = nullptr;
  std::vector<IModule*> layers_;
  IModule* final_norm_ = nullptr;
  OutputLayer* output_layer_ = nullptr;
  MultiTokenPrediction* mtp_ = nullptr;  // child "mtp", with mtp_num_layers > 0
  Kernel loss_fwd_, loss_bwd_, add_, masked_sum_, shard_stats_, combine_;
  Kernel loss_fwd_bwd_;  // cross_entropy_fwd_bwd, optional
};

}  // namespace loom::transformer
