#include "plugins/transformer/dot_product_attention.h"

#include <cmath>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {

enum Slot : int32_t { kQ, kK, kV, kSegments, kProbs };
constexpr uint64_t kDropoutStream = 1;

// `x` (B, H, T, X) seen as (B, G, H / G * T, X): the heads of a query group are contiguous.
TensorView grouped(const TensorView& x, int64_t groups) {
  return make_view(x.data, x.dtype,
                   {x.shape[0], groups, x.shape[1] / groups * x.shape[2], x.shape[3]}, x.device);
}

}  // namespace

DotProductAttention::DotProductAttention(const nlohmann::json& options, IBuildContext& ctx)
    : causal_(options.at("causal").get<bool>()),
      softmax_scale_(
          options.at("softmax_scale").is_null() ? 0.0 : options.at("softmax_scale").get<double>()),
      dropout_p_(inherited_or<float>(options, "attention_dropout", 0.f)),
      dtype_(params_dtype(options)),
      device_(device_of(options)) {
  if (!(dropout_p_ >= 0.f && dropout_p_ < 1.f))
    invalid("/attention_dropout: must be in [0, 1), got " + std::to_string(dropout_p_));
  IHost& host = *ctx.host();
  gemm_ = Kernel(host, ops::kGemm, device_, dtype_);
  softmax_fwd_ = Kernel(host, ops::kMaskedSoftmaxFwd, device_, dtype_);
  softmax_bwd_ = Kernel(host, ops::kMaskedSoftmaxBwd, device_, dtype_);
  dropout_fwd_ = Kernel(host, ops::kDropoutFwd, device_, dtype_);
  dropout_bwd_ = Kernel(host, ops::kDropoutBwd, device_, dtype_);
  swap_ = Kernel(host, ops::kSwapAxes12, device_, dtype_);
  split_ = Kernel(host, ops::kSplitQkv, device_, dtype_);
  dropout_stream_ = tensor_parallel_stream(host, kDropoutStream);
  cp_ = ContextParallelAttention(
      host, device_, dtype_,
      context_parallel_comm(inherited_or<std::string>(options, "cp_comm_type", "p2p")));
}

ops::AttentionAttrs DotProductAttention::cp_attrs(IForwardContext& ctx, int64_t head_dim) const {
  ops::AttentionAttrs a{};
  a.scale = scale_for(head_dim);
  a.causal = causal_ ? 1 : 0;
  a.dropout_p = ctx.training() ? dropout_p_ : 0.f;
  if (a.dropout_p > 0.f) ctx.rng(this, dropout_stream_, &a.key, &a.counter);
  return a;
}

float DotProductAttention::scale_for(int64_t head_dim) const {
  return softmax_scale_ > 0 ? static_cast<float>(softmax_scale_)
                            : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

TensorView DotProductAttention::swap(IForwardContext& ctx, const TensorView& x) const {
  TensorView y = allocate(ctx, x.dtype, {x.shape[0], x.shape[2], x.shape[1], x.shape[3]}, x.device);
  swap_({x}, {y});
  return y;
}

TensorView DotProductAttention::probabilities(IForwardContext& ctx, const TensorView& qh,
                                              const TensorView& kh,
                                              const TensorView& segments) const {
  int64_t b = qh.shape[0], h = qh.shape[1], t = qh.shape[2], d = qh.shape[3];
  int64_t g = kh.shape[1], s = kh.shape[2];
  TensorView scores = allocate(ctx, dtype_, {b, h, t, s}, device_);
  gemm_({grouped(qh, g), kh}, {grouped(scores, g)}, ops::GemmAttrs{0, 1, 1.f, 0.f});
  TensorView probs = allocate(ctx, dtype_, {b, h, t, s}, device_);
  softmax_fwd_({scores, segments}, {probs}, ops::SoftmaxAttrs{scale_for(d), causal_ ? 1 : 0});
  release(ctx, scores);
  return probs;
}

void DotProductAttention::run_forward(IForwardContext& ctx, const TensorView* inputs,
                                      int32_t num_inputs, TensorView* outputs,
                                      int32_t num_outputs) {
  expect_count("dot_product attention forward inputs", num_inputs, 3);
  expect_count("dot_product attention forward outputs", num_outputs, 1);
  // Packed, or views of the layer's fused QKV projection (attention 1.2): this composition
  // of ops takes packed tensors, so views are copied (and the copies released below).
  const TensorView fused = expect_qkv(inputs[0], inputs[1], inputs[2], dtype_, "attention");
  const QkvViews qkv =
      present(fused) ? packed_qkv(ctx, split_, fused) : QkvViews{inputs[0], inputs[1], inputs[2]};
  const TensorView &q = qkv.q, &k = qkv.k, &v = qkv.v;
  int64_t b = q.shape[0], t = q.shape[1], h = q.shape[2], d = q.shape[3];
  int64_t g = k.shape[2];
  if (g < 1 || h % g != 0)
    fail(Code::kInvalidArgument,
         detail::concat("attention: ", h, " query heads are not a multiple of ", g,
                        " key/value groups"));
  TensorView segments = num_inputs > 3 ? inputs[3] : empty_view();
  if (present(segments)) expect(segments, {b, t}, DType::kI32, "attention segment ids");
  if (num_inputs > 4 && present(inputs[4]))
    fail(Code::kUnimplemented, "dot_product attention: an additive bias is not supported");

  if (cp_.active()) {  // the sequence is split over the context-parallel ranks
    outputs[0] = cp_.forward(ctx, this, kQ, q, k, v, segments, cp_attrs(ctx, d));
    if (present(fused)) release_all(ctx, {q, k, v});  // what the ring saved stays
    return;
  }
  TensorView qh = swap(ctx, q), kh = swap(ctx, k), vh = swap(ctx, v);  // head-major
  TensorView probs = probabilities(ctx, qh, kh, segments);             // (B, H, T, S)
  TensorView dropped = probs;
  if (ctx.training() && dropout_p_ > 0.f) {
    ops::DropoutAttrs attrs{dropout_p_, 0, 0};
    ctx.rng(this, dropout_stream_, &attrs.key, &attrs.counter);
    dropped = allocate_like(ctx, probs);
    dropout_fwd_({probs}, {dropped}, attrs);
  }
  TensorView oh = allocate(ctx, dtype_, {b, h, t, d}, device_);
  gemm_({grouped(dropped, g), vh}, {grouped(oh, g)}, ops::GemmAttrs{0, 0, 1.f, 0.f});
  outputs[0] = swap(ctx, oh);  // (B, T, H, D)

  if (ctx.training()) {
    save(ctx, this, kQ, qh);
    save(ctx, this, kK, kh);
    save(ctx, this, kV, vh);
    save(ctx, this, kSegments, segments);
    if (ctx.recompute() != RecomputePolicy::kSelective) save(ctx, this, kProbs, probs);
  }
  release_all(ctx, {qh, kh, vh, probs, dropped, oh});  // the saves keep what backward needs
  if (present(fused)) release_all(ctx, {q, k, v});     // the packed copies
}

void DotProductAttention::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                                       int32_t num_grad_outputs, TensorView* grad_inputs,
                                       int32_t num_grad_inputs) {
  expect_count("dot_product attention backward grad outputs", num_grad_outputs, 1);
  expect_count("dot_product attention backward grad inputs", num_grad_inputs, 3);
  if (cp_.active()) {
    const TensorView& dout = grad_outputs[0];
    expect(dout, {-1, -1, -1, -1}, dtype_, "attention grad output");
    cp_.backward(ctx, this, kQ, dout, cp_attrs(ctx, dout.shape[3]), grad_inputs[0], grad_inputs[1],
                 grad_inputs[2]);
    return;
  }
  TensorView qh = load(ctx, this, kQ), kh = load(ctx, this, kK), vh = load(ctx, this, kV);
  TensorView segments = load(ctx, this, kSegments);
  int64_t b = qh.shape[0], h = qh.shape[1], t = qh.shape[2], d = qh.shape[3];
  int64_t g = kh.shape[1], s = kh.shape[2];
  expect(grad_outputs[0], {b, t, h, d}, dtype_, "attention grad output");

  TensorView probs = ctx.recompute() == RecomputePolicy::kSelective
                         ? probabilities(ctx, qh, kh, segments)
                         : load(ctx, this, kProbs);
  bool dropout = ctx.training() && dropout_p_ > 0.f;
  ops::DropoutAttrs attrs{dropout_p_, 0, 0};
  TensorView dropped = probs;
  if (dropout) {  // the same stream as forward: the mask is redrawn, not stored
    ctx.rng(this, dropout_stream_, &attrs.key, &attrs.counter);
    dropped = allocate_like(ctx, probs);
    dropout_fwd_({probs}, {dropped}, attrs);
  }
  TensorView doh = swap(ctx, grad_outputs[0]);  // (B, H, T, D)
  TensorView dvh = allocate(ctx, dtype_, {b, g, s, d}, device_);
  gemm_({grouped(dropped, g), grouped(doh, g)}, {dvh}, ops::GemmAttrs{1, 0, 1.f, 0.f});
  TensorView ddropped = allocate(ctx, dtype_, {b, h, t, s}, device_);
  gemm_({grouped(doh, g), vh}, {grouped(ddropped, g)}, ops::GemmAttrs{0, 1, 1.f, 0.f});
  TensorView dprobs = ddropped;
  if (dropout) {
    dprobs = allocate_like(ctx, ddropped);
    dropout_bwd_({ddropped}, {dprobs}, attrs);
  }
  TensorView dscores = allocate_like(ctx, probs);
  softmax_bwd_({dprobs, probs}, {dscores}, ops::SoftmaxAttrs{scale_for(d), causal_ ? 1 : 0});
  TensorView dqh = allocate(ctx, dtype_, {b, h, t, d}, device_);
  gemm_({grouped(dscores, g), kh}, {grouped(dqh, g)}, ops::GemmAttrs{0, 0, 1.f, 0.f});
  TensorView dkh = allocate(ctx, dtype_, {b, g, s, d}, device_);
  gemm_({grouped(dscores, g), grouped(qh, g)}, {dkh}, ops::GemmAttrs{1, 0, 1.f, 0.f});
  grad_inputs[0] = swap(ctx, dqh);
  grad_inputs[1] = swap(ctx, dkh);
  grad_inputs[2] = swap(ctx, dvh);
  // A recomputed probs is ours; a saved one belongs to the save (dropped after backward).
  bool recomputed = ctx.recompute() == RecomputePolicy::kSelective;
  release_all(
      ctx,
      {recomputed ? probs : empty_view(), dropped, doh, dvh, ddropped, dprobs, dscores, dqh, dkh},
      {recomputed ? empty_view() : probs});
}

}  // namespace loom::transformer
