#include "plugins/transformer/output_layer.h"

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {
enum Slot : int32_t { kInput, kSite };
}  // namespace

OutputLayer::OutputLayer(IHost& host, const EmbeddingConfig& config, const Embedding* tied_to)
    : config_(config),
      tied_to_(tied_to),
      tp_(host, config.device, config.dtype, config.sequence_parallel),
      local_vocab_(tp_.split(config.padded_vocab_size, "/vocab_size")),
      linear_(host, config.device, config.dtype) {
  if (tied_to_ == nullptr) {
    // Its gradient's writers, this layer's Linear site and multi-token prediction's GEMM,
    // ask the context before each write (kParamGradOverwrite).
    ParamSpec spec{{config.padded_vocab_size, config.hidden_size},
                   0,
                   kParamGradOverwrite,
                   ParamInit::kNormal,
                   config.init_std,
                   tp_.size()};
    spec.valid_rows = config.vocab_size;  // the padding rows stay 0: zero logits, masked
    weight_ = add_param("weight", config.dtype, spec);
  }
}

const TensorView& OutputLayer::weight() const {
  return tied_to_ != nullptr ? tied_to_->word_weight() : value(weight_);
}
const TensorView& OutputLayer::weight_grad() const {
  return tied_to_ != nullptr ? tied_to_->word_grad() : grad(weight_);
}

void OutputLayer::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                              TensorView* outputs, int32_t num_outputs) {
  expect_count("output_layer forward inputs", num_inputs, 1);
  expect_count("output_layer forward outputs", num_outputs, 1);
  int64_t c = config_.hidden_size, v = local_vocab_;
  expect(inputs[0], {-1, -1, c}, config_.dtype, "output_layer input");
  TensorView x = tp_.enter(ctx, inputs[0]);  // (B, T, C)
  TensorView logits = allocate(ctx, config_.dtype, {x.shape[0], x.shape[1], v}, config_.device);
  linear_.forward(rows(x, c), weight(), empty_view(), rows(logits, v));
  if (ctx.training()) save(ctx, this, kInput, x);
  release_all(ctx, {x}, {inputs[0]});  // a gathered x is kept by the save in training
  outputs[0] = logits;
}

void OutputLayer::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                               int32_t num_grad_outputs, TensorView* grad_inputs,
                               int32_t num_grad_inputs) {
  expect_count("output_layer backward grad outputs", num_grad_outputs, 1);
  expect_count("output_layer backward grad inputs", num_grad_inputs, 1);
  TensorView x = load(ctx, this, kInput);
  int64_t c = config_.hidden_size, v = local_vocab_;
  expect(grad_outputs[0], {x.shape[0], x.shape[1], v}, config_.dtype, "output_layer grad output");
  TensorView dx_partial = allocate_like(ctx, x);  // this rank's vocabulary rows' share
  // Zero-bubble schedules: the weight gradient waits for backward_weight.
  linear_.backward(ctx, {this, kSite}, rows(grad_outputs[0], v), rows(x, c), weight(),
                   weight_grad(), empty_view(), rows(dx_partial, c),
                   weight_grads_deferred(ctx) ? deferred_owner() : nullptr);
  grad_inputs[0] = tp_.enter_backward(ctx, dx_partial);
}

void OutputLayer::run_backward_weight(IForwardContext& ctx) {
  linear_.backward_weight(ctx, {this, kSite}, deferred_owner(), weight_grad(), empty_view());
}

}  // namespace loom::transformer
