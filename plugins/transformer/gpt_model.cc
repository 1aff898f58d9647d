#include "plugins/transformer/gpt_model.h"

#include <string>

#include "plugins/transformer/child.h"
#include "plugins/transformer/options.h"
#include "plugins/transformer/views.h"

namespace loom::transformer {
namespace {

enum Slot : int32_t { kLogits, kLabels, kMask, kLse };

}  // namespace

GptModel::GptModel(const nlohmann::json& options, IBuildContext& ctx)
    : config_(GptConfig::from_options(options)) {
  IHost& host = *ctx.host();
  const GptConfig& c = config_;
  EmbeddingConfig embedding{c.vocab_size,
                            c.hidden_size,
                            c.position_embedding == "learned" ? c.max_position_embeddings : 0,
                            static_cast<float>(c.init_std),
                            static_cast<float>(c.hidden_dropout),
                            c.tie_embeddings,
                            c.params_dtype,
                            c.device};
  embedding_ = new Embedding(host, embedding);
  add_child("embedding", embedding_);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    IModule* layer = build_child<ILayer>(ctx, "layer", c.layer_options(i + 1));
    add_child("decoder.layers." + std::to_string(i), layer);
    layers_.push_back(layer);
  }
  nlohmann::json norm = {{"hidden_size", c.hidden_size},
                         {"params_dtype", dtype_name(c.params_dtype)},
                         {"device", device_name(c.device)}};
  add_child("decoder.final_layernorm", final_norm_ = build_child<INorm>(ctx, "final_norm", norm));
  output_layer_ = new OutputLayer(host, embedding, c.tie_embeddings ? embedding_ : nullptr);
  add_child("output_layer", output_layer_);
  loss_fwd_ = Kernel(host, ops::kCrossEntropyFwd, c.device, c.params_dtype);
  loss_bwd_ = Kernel(host, ops::kCrossEntropyBwd, c.device, c.params_dtype);
  add_ = Kernel(host, ops::kAdd, c.device, c.params_dtype);
}

void GptModel::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                           TensorView* outputs, int32_t num_outputs) {
  expect_count("gpt forward inputs", num_inputs, 2);
  expect_count("gpt forward outputs", num_outputs, 1);
  const TensorView& tokens = inputs[0];
  expect(tokens, {-1, -1}, DType::kI32, "gpt tokens");
  int64_t b = tokens.shape[0], t = tokens.shape[1], n = b * t, v = config_.vocab_size;
  const TensorView& labels = inputs[1];
  expect(labels, {b, t}, DType::kI32, "gpt labels");
  TensorView mask = num_inputs > 2 ? inputs[2] : empty_view();
  if (present(mask)) expect(mask, {b, t}, DType::kF32, "gpt loss mask");
  TensorView positions = num_inputs > 3 ? inputs[3] : empty_view();
  TensorView segments = num_inputs > 4 ? inputs[4] : empty_view();
  if (present(segments)) expect(segments, {b, t}, DType::kI32, "gpt segment ids");

  TensorView hidden = call_forward(*embedding_, ctx, {tokens, positions}, 1, "embedding")[0];
  for (size_t i = 0; i < layers_.size(); ++i)
    hidden = call_forward(*layers_[i], ctx, {hidden, positions, segments}, 1, "decoder layer")[0];
  hidden = call_forward(*final_norm_, ctx, {hidden}, 1, "final_layernorm")[0];
  TensorView logits = call_forward(*output_layer_, ctx, {hidden}, 1, "output_layer")[0];

  TensorView loss = allocate(ctx, DType::kF32, {n}, config_.device);
  TensorView lse = allocate(ctx, DType::kF32, {n}, config_.device);
  TensorView mean = allocate(ctx, DType::kF32, {1}, config_.device);
  TensorView flat_mask = present(mask) ? reshape(mask, {n}) : empty_view();
  loss_fwd_({rows(logits, v), reshape(labels, {n}), flat_mask}, {loss, lse, mean});
  if (ctx.training()) {
    save(ctx, this, kLogits, logits);
    save(ctx, this, kLabels, labels);
    save(ctx, this, kMask, mask);
    save(ctx, this, kLse, lse);
  }
  outputs[0] = make_view(mean.data, DType::kF32, nullptr, 0, config_.device);  // scalar
  if (num_outputs > 1) outputs[1] = config_.return_logits ? logits : empty_view();
}

void GptModel::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                            int32_t num_grad_outputs, TensorView* grad_inputs,
                            int32_t num_grad_inputs) {
  expect_count("gpt backward grad outputs", num_grad_outputs, 1);
  TensorView logits = load(ctx, this, kLogits), labels = load(ctx, this, kLabels);
  TensorView mask = load(ctx, this, kMask), lse = load(ctx, this, kLse);
  int64_t b = logits.shape[0], t = logits.shape[1], n = b * t, v = config_.vocab_size;
  const TensorView& dloss = grad_outputs[0];
  if (dloss.data == nullptr || dloss.dtype != DType::kF32 || numel(dloss) != 1)
    fail(Code::kInvalidArgument, "gpt backward: grad_outputs[0] must be the f32 scalar d(loss)");
  TensorView dlogits = allocate_like(ctx, logits);
  loss_bwd_({rows(logits, v), reshape(labels, {n}), present(mask) ? reshape(mask, {n}) : mask, lse,
             make_view(dloss.data, DType::kF32, {1}, dloss.device)},
            {rows(dlogits, v)});
  if (num_grad_outputs > 1 && present(grad_outputs[1])) {
    expect(grad_outputs[1], {b, t, v}, config_.params_dtype, "gpt logits gradient");
    add_({dlogits, grad_outputs[1]}, {dlogits});
  }
  TensorView dhidden = call_backward(*output_layer_, ctx, {dlogits}, 1, "output_layer")[0];
  dhidden = call_backward(*final_norm_, ctx, {dhidden}, 1, "final_layernorm")[0];
  for (size_t i = layers_.size(); i-- > 0;)
    dhidden = call_backward(*layers_[i], ctx, {dhidden}, 3, "decoder layer")[0];
  call_backward(*embedding_, ctx, {dhidden}, 0, "embedding");
  for (int32_t i = 0; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
}

}  // namespace loom::transformer
