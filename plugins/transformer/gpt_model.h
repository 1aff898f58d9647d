// GptModel (kinds::kModel "gpt"): a decoder-only language model in the shape of
// Megatron-Core's GPTModel: embedding, num_layers copies of the "layer" node, the final
// norm, the output layer (tied to the word embeddings or not) and the cross-entropy loss.
// GPT-2 (learned positions, LayerNorm, GELU) and LLaMA (RoPE, RMSNorm, SwiGLU, GQA, no
// biases, untied) are both configurations of it.
// Children: "embedding", "decoder.layers.<i>" (i from 0), "decoder.final_layernorm",
// "output_layer"; so parameters are named as in Megatron-Core's state dict.
//   forward/backward: kinds/model.h (tokens, labels, loss mask, position ids -> loss, logits).
//   backward also accepts grad_outputs[1], a gradient of the logits (B, T, V), added to the
//   loss's (for objectives beyond the loss; tests).
// Tensor parallelism: the embedding and the output layer are vocab-parallel, and so is the
// loss (Megatron's vocab-parallel cross entropy): each rank reduces its (N, V/P) logits to
// per-row statistics (cross_entropy_shard_stats), the statistics are all-gathered and
// combined into the loss (cross_entropy_combine), and each rank's logit gradient is its
// shard's. The logits output is then not available (return_logits is refused).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "plugins/transformer/embedding.h"
#include "plugins/transformer/gpt_config.h"
#include "plugins/transformer/module_base.h"
#include "plugins/transformer/output_layer.h"
#include "plugins/transformer/tensor_parallel.h"

namespace loom::transformer {

class GptModel final : public ModuleBase<IModel> {
 public:
  GptModel(const nlohmann::json& options, IBuildContext& ctx);

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  GptConfig config_;
  TensorParallel tp_;
  Embedding* embedding_ = nullptr;
  std::vector<IModule*> layers_;
  IModule* final_norm_ = nullptr;
  OutputLayer* output_layer_ = nullptr;
  Kernel loss_fwd_, loss_bwd_, add_, shard_stats_, combine_;
};

}  // namespace loom::transformer
