#include "plugins/fused_attention/fused_attention.h"

#include <cmath>
#include <string>

namespace loom::fused_attention {
namespace {

enum Slot : int32_t { kQ, kK, kV, kOut, kLse, kSegments };
// The random stream of attention dropout; the same purpose as the dot_product core's.
constexpr uint64_t kDropoutStream = 1;

}  // namespace

FusedAttention::FusedAttention(const nlohmann::json& options, IBuildContext& ctx)
    : causal_(options.at("causal").get<bool>()),
      softmax_scale_(
          options.at("softmax_scale").is_null() ? 0.0 : options.at("softmax_scale").get<double>()),
      dropout_p_(nn::inherited_or<float>(options, "attention_dropout", 0.f)),
      dtype_(nn::params_dtype(options)),
      device_(nn::device_of(options)) {
  if (!(dropout_p_ >= 0.f && dropout_p_ < 1.f))
    nn::invalid("/attention_dropout: must be in [0, 1), got " + std::to_string(dropout_p_));
  fwd_ = Kernel(*ctx.host(), ops::kAttentionFwd, device_, dtype_);
  split_ = Kernel(*ctx.host(), ops::kSplitQkv, device_, dtype_);
  bwd_ = Kernel(*ctx.host(), ops::kAttentionBwd, device_, dtype_);
  dropout_stream_ = nn::tensor_parallel_stream(*ctx.host(), kDropoutStream);
  cp_ = nn::ContextParallelAttention(
      *ctx.host(), device_, dtype_,
      nn::context_parallel_comm(nn::inherited_or<std::string>(options, "cp_comm_type", "p2p")));
}

ops::AttentionAttrs FusedAttention::attrs(IForwardContext& ctx, int64_t head_dim) const {
  ops::AttentionAttrs a{};
  a.scale = softmax_scale_ > 0 ? static_cast<float>(softmax_scale_)
                               : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  a.causal = causal_ ? 1 : 0;
  a.dropout_p = ctx.training() ? dropout_p_ : 0.f;
  if (a.dropout_p > 0.f) ctx.rng(this, dropout_stream_, &a.key, &a.counter);
  return a;
}

void FusedAttention::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                                 TensorView* outputs, int32_t num_outputs) {
  nn::expect_count("fused attention forward inputs (q, k, v)", num_inputs, 3);
  nn::expect_count("fused attention forward outputs", num_outputs, 1);
  TensorView q = inputs[0], k = inputs[1], v = inputs[2];
  // Packed, or views of the layer's fused QKV projection, read in place (attention 1.2).
  const TensorView fused = nn::expect_qkv(q, k, v, dtype_, "fused attention");
  int64_t b = q.shape[0], t = q.shape[1], h = q.shape[2], d = q.shape[3];
  int64_t g = k.shape[2];
  if (g < 1 || h % g != 0)
    nn::invalid(detail::concat("fused attention: ", h, " query heads are not a multiple of ", g,
                               " key/value groups"));
  TensorView segments = num_inputs > 3 ? inputs[3] : empty_view();
  if (present(segments)) nn::expect(segments, {b, t}, DType::kI32, "fused attention segment ids");
  if (num_inputs > 4 && present(inputs[4]))
    fail(Code::kUnimplemented, "fused attention: an additive bias is not supported");
  if (cp_.active()) {      // the sequence is split over the context-parallel ranks
    if (present(fused)) {  // the ring sends k and v: packed copies
      nn::QkvViews packed = nn::packed_qkv(ctx, split_, fused);
      outputs[0] =
          cp_.forward(ctx, this, kQ, packed.q, packed.k, packed.v, segments, attrs(ctx, d));
      nn::release_all(ctx, {packed.q, packed.k, packed.v});  // what the ring saved stays
      return;
    }
    outputs[0] = cp_.forward(ctx, this, kQ, q, k, v, segments, attrs(ctx, d));
    return;
  }
  TensorView out = allocate(ctx, dtype_, {b, t, h, d}, device_);
  TensorView lse = allocate(ctx, DType::kF32, {b, h, t}, device_);
  fwd_({q, k, v, segments}, {out, lse}, attrs(ctx, d));
  if (ctx.training()) {
    const TensorView* keep[] = {&q, &k, &v, &out, &lse, &segments};
    for (int32_t slot = kQ; slot <= kSegments; ++slot) nn::save(ctx, this, slot, *keep[slot]);
  }
  release(ctx, lse);  // kept by the save in training
  outputs[0] = out;
}

void FusedAttention::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                                  int32_t num_grad_outputs, TensorView* grad_inputs,
                                  int32_t num_grad_inputs) {
  nn::expect_count("fused attention backward grad outputs (d(out))", num_grad_outputs, 1);
  nn::expect_count("fused attention backward grad inputs (dq, dk, dv)", num_grad_inputs, 3);
  if (cp_.active()) {
    const TensorView& dout = grad_outputs[0];
    nn::expect(dout, {-1, -1, -1, -1}, dtype_, "fused attention d(out)");
    cp_.backward(ctx, this, kQ, dout, attrs(ctx, dout.shape[3]), grad_inputs[0], grad_inputs[1],
                 grad_inputs[2]);
    return;
  }
  TensorView saved[kSegments + 1];
  for (int32_t slot = kQ; slot <= kSegments; ++slot) saved[slot] = nn::load(ctx, this, slot);
  const TensorView &q = saved[kQ], &k = saved[kK], &v = saved[kV];
  nn::expect(grad_outputs[0], {q.shape[0], q.shape[1], q.shape[2], q.shape[3]}, dtype_,
             "fused attention d(out)");
  // The base drops q, k, v, out and lse after this: they served this backward only.
  nn::QkvViews grads;
  const TensorView fused = nn::fused_qkv_of(q, k, v);
  if (present(fused)) {  // the gradients as the same views of one tensor: no merge copy
    nn::fused_qkv_views(nn::allocate_like(ctx, fused), &grads);
  } else {
    grads = {nn::allocate_like(ctx, q), nn::allocate_like(ctx, k), nn::allocate_like(ctx, v)};
  }
  grad_inputs[0] = grads.q, grad_inputs[1] = grads.k, grad_inputs[2] = grads.v;
  bwd_({grad_outputs[0], q, k, v, saved[kOut], saved[kLse], saved[kSegments]},
       {grad_inputs[0], grad_inputs[1], grad_inputs[2]}, attrs(ctx, q.shape[3]));
}

}  // namespace loom::fused_attention
