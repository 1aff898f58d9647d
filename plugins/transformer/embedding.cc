#include "plugins/transformer/embedding.h"

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {

enum Slot : int32_t { kTokens, kPositions, kGradOutput };
constexpr uint64_t kDropoutStream = 1;

}  // namespace

Embedding::Embedding(IHost& host, const EmbeddingConfig& config)
    : config_(config), tp_(host, config.device, config.dtype, config.sequence_parallel) {
  int64_t v = config.padded_vocab_size, c = config.hidden_size;
  cp_rank_ = group(host, ParallelRole::kContext).rank();
  cp_size_ = group(host, ParallelRole::kContext).size();
  vocab_start_ = tp_.rank() * tp_.split(v, "/vocab_size");
  ParamSpec word{{v, c},
                 0,
                 config.tied ? kParamTiedEmbedding : kParamNone,
                 ParamInit::kNormal,
                 config.init_std,
                 tp_.size()};
  word.valid_rows = config.vocab_size;
  sharded_ = tp_.size() > 1 || v > config.vocab_size;
  word_ = add_param("word_embeddings.weight", config.dtype, word);
  if (config.max_positions > 0)
    position_ = add_param("position_embeddings.weight", config.dtype,
                          ParamSpec{{config.max_positions, c},
                                    -1,
                                    tp_.size() > 1 ? kParamSequenceParallel : kParamNone,
                                    ParamInit::kNormal,
                                    config.init_std});
  Device device = config.device;
  embed_fwd_ = Kernel(host, ops::kEmbeddingFwd, device, config.dtype);
  embed_bwd_ = Kernel(host, ops::kEmbeddingBwd, device, config.dtype);
  add_ = Kernel(host, ops::kAdd, device, config.dtype);
  bias_add_ = Kernel(host, ops::kBiasAdd, device, config.dtype);
  bias_grad_ = Kernel(host, ops::kBiasGrad, device, config.dtype);
  dropout_fwd_ = Kernel(host, ops::kDropoutFwd, device, config.dtype);
  dropout_bwd_ = Kernel(host, ops::kDropoutBwd, device, config.dtype);
}

TensorView Embedding::first_rows(const TensorView& table, int64_t t) const {
  if (t > config_.max_positions)
    fail(Code::kInvalidArgument,
         detail::concat("embedding: sequence length ", t, " exceeds max_position_embeddings ",
                        config_.max_positions, " of the learned position table"));
  return make_view(table.data, table.dtype, {t, config_.hidden_size}, table.device);
}

void Embedding::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                            TensorView* outputs, int32_t num_outputs) {
  if (config_.table_only)
    fail(Code::kInternal, "embedding: the last stage's tied table is not run forward");
  expect_count("embedding forward inputs", num_inputs, 1);
  expect_count("embedding forward outputs", num_outputs, 1);
  const TensorView& tokens = inputs[0];
  expect(tokens, {-1, -1}, DType::kI32, "tokens");
  int64_t b = tokens.shape[0], t = tokens.shape[1], c = config_.hidden_size;
  TensorView positions = num_inputs > 1 ? inputs[1] : empty_view();
  if (present(positions)) expect(positions, {b, t}, DType::kI32, "position ids");

  TensorView y = allocate(ctx, config_.dtype, {b, t, c}, config_.device);
  if (!sharded_)
    embed_fwd_({value(word_), reshape(tokens, {b * t})}, {rows(y, c)});
  else  // this rank's vocabulary rows; zeros for the others' tokens (and padding never read)
    embed_fwd_({value(word_), reshape(tokens, {b * t})}, {rows(y, c)},
               ops::EmbeddingAttrs{vocab_start_, config_.vocab_size});
  if (position_ >= 0 && tp_.rank() == 0) {
    if (present(positions)) {
      TensorView pos = allocate(ctx, config_.dtype, {b, t, c}, config_.device);
      embed_fwd_({value(position_), reshape(positions, {b * t})}, {rows(pos, c)});
      add_({y, pos}, {y});
      release(ctx, pos);
    } else {  // positions 0..T-1: the first T rows of the table, added to every sequence:
      // y (B, T C) += table (T C) broadcast over the sequences, one launch
      TensorView table = first_rows(value(position_), t);
      bias_add_({reshape(table, {t * c})}, {reshape(y, {b, t * c})});
    }
  }
  TensorView partial = y;
  y = tp_.exit(ctx, partial);  // summed over the group: (B, T, C) or the shard (B, T/P, C)
  release_all(ctx, {partial}, {y});
  if (ctx.training() && config_.dropout > 0.f) {
    ops::DropoutAttrs attrs{config_.dropout, 0, 0};
    ctx.rng(this, kDropoutStream, &attrs.key, &attrs.counter);
    dropout_sequence(dropout_fwd_, attrs, y, y, tp_, cp_rank_, cp_size_);
  }
  if (ctx.training()) {
    save(ctx, this, kTokens, tokens);
    save(ctx, this, kPositions, positions);
  }
  outputs[0] = y;
}

void Embedding::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                             int32_t num_grad_outputs, TensorView* grad_inputs,
                             int32_t num_grad_inputs) {
  expect_count("embedding backward grad outputs", num_grad_outputs, 1);
  for (int32_t i = 0; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
  TensorView tokens = load(ctx, this, kTokens), positions = load(ctx, this, kPositions);
  if (weight_grads_deferred(ctx)) {  // all of it is weight gradients: kept for later
    save(ctx, deferred_owner(), kTokens, tokens);
    save(ctx, deferred_owner(), kPositions, positions);
    save(ctx, deferred_owner(), kGradOutput, grad_outputs[0]);
    return;
  }
  weight_grads(ctx, grad_outputs[0], tokens, positions);
}

void Embedding::run_backward_weight(IForwardContext& ctx) {
  if (config_.table_only) return;  // never ran
  weight_grads(ctx, load(ctx, deferred_owner(), kGradOutput), load(ctx, deferred_owner(), kTokens),
               load(ctx, deferred_owner(), kPositions));
}

void Embedding::weight_grads(IForwardContext& ctx, const TensorView& grad_output,
                             const TensorView& tokens, const TensorView& positions) {
  int64_t b = tokens.shape[0], t = tokens.shape[1], c = config_.hidden_size;
  TensorView dy = grad_output, dropped{};
  expect(dy, {b, tp_.sequence_parallel() ? t / tp_.size() : t, c}, config_.dtype,
         "embedding grad output");
  if (ctx.training() && config_.dropout > 0.f) {
    ops::DropoutAttrs attrs{config_.dropout, 0, 0};
    ctx.rng(this, kDropoutStream, &attrs.key, &attrs.counter);
    TensorView dx = allocate_like(ctx, dy);
    dropout_sequence(dropout_bwd_, attrs, dy, dx, tp_, cp_rank_, cp_size_);
    dy = dropped = dx;
  }
  dy = tp_.exit_backward(ctx, dy);  // (B, T, C)
  if (!sharded_)
    embed_bwd_({rows(dy, c), reshape(tokens, {b * t})}, {grad(word_)});
  else
    embed_bwd_({rows(dy, c), reshape(tokens, {b * t})}, {grad(word_)},
               ops::EmbeddingAttrs{vocab_start_, config_.vocab_size});
  if (position_ >= 0 && tp_.rank() == 0) {
    if (present(positions)) {
      embed_bwd_({rows(dy, c), reshape(positions, {b * t})}, {grad(position_)});
    } else {  // dtable (T C) += the sum of dy (B, T C) over the sequences, one launch
      TensorView dtable = first_rows(grad(position_), t);
      bias_grad_({reshape(dy, {b, t * c})}, {reshape(dtable, {t * c})});
    }
  }
  release_all(ctx, {dropped, dy}, {grad_output});
}

}  // namespace loom::transformer
