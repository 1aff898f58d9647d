#include "plugins/fused_attention/fused_attention.h"

#include <cmath>
#include <string>
#include <vector>

namespace loom::fused_attention {
namespace {

enum Slot : int32_t { kQ, kK, kV, kOut, kLse, kSegments };
// The random stream of attention dropout; the same purpose as the dot_product core's.
constexpr uint64_t kDropoutStream = 1;

// Attention dropout inside a tensor-parallel region: each rank holds other heads and draws
// from its own part of the stream (Megatron's model-parallel RNG); rank 0's is the
// single-rank stream.
uint64_t dropout_stream(IHost& host) {
  ICommunicator* tp = nullptr;
  throw_if_error(host.communicator(make_string_view("tp"), &tp), "the tensor-parallel group");
  return kDropoutStream + (static_cast<uint64_t>(tp->rank()) << 32);
}

[[noreturn]] void invalid(const std::string& message) { fail(Code::kInvalidArgument, message); }

std::string option_string(const nlohmann::json& options, const char* key, const char* fallback) {
  auto it = options.find(key);
  return it == options.end() || it->is_null() ? fallback : it->get<std::string>();
}

// Contiguous, `dtype`, rank 4, and the extents of `shape` that are >= 0.
void expect(const TensorView& view, std::vector<int64_t> shape, DType dtype, const char* what) {
  bool ok = view.data != nullptr && view.ndim == static_cast<int32_t>(shape.size()) &&
            view.dtype == dtype && is_contiguous(view);
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = shape[d] < 0 || view.shape[d] == shape[d];
  if (!ok)
    fail(
        Code::kInvalidArgument,
        detail::concat("fused attention ", what, ": expected a contiguous ", dtype_name(dtype),
                       " tensor of rank ", shape.size(), " matching the others, got ",
                       view.data == nullptr ? "none" : dtype_name(view.dtype), shape_string(view)));
}

TensorView alloc(IForwardContext& ctx, DType dtype, std::initializer_list<int64_t> shape,
                 Device device) {
  return allocate(ctx, dtype, shape, device);
}

}  // namespace

FusedAttention::FusedAttention(const nlohmann::json& options, IBuildContext& ctx)
    : causal_(options.at("causal").get<bool>()),
      softmax_scale_(
          options.at("softmax_scale").is_null() ? 0.0 : options.at("softmax_scale").get<double>()),
      dropout_p_(options.contains("attention_dropout") && !options["attention_dropout"].is_null()
                     ? options["attention_dropout"].get<float>()
                     : 0.f) {
  if (!(dropout_p_ >= 0.f && dropout_p_ < 1.f))
    invalid("/attention_dropout: must be in [0, 1), got " + std::to_string(dropout_p_));
  std::string dtype = option_string(options, "params_dtype", "f32");
  dtype_ = dtype_from_name(dtype.c_str());
  if (dtype_ != DType::kF32 && dtype_ != DType::kBF16 && dtype_ != DType::kF16)
    invalid("/params_dtype: '" + dtype + "' is not one of f32, bf16, f16");
  std::string device = option_string(options, "device", "cpu");
  if (device != "cpu" && device != "cuda")
    invalid("/device: '" + device + "' is not one of cpu, cuda");
  device_ = Device{device == "cuda" ? DeviceType::kCuda : DeviceType::kCpu, 0};
  fwd_ = Kernel(*ctx.host(), ops::kAttentionFwd, device_, dtype_);
  bwd_ = Kernel(*ctx.host(), ops::kAttentionBwd, device_, dtype_);
  dropout_stream_ = dropout_stream(*ctx.host());
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

Status FusedAttention::forward(IForwardContext* ctx, const TensorView* inputs, int32_t num_inputs,
                               TensorView* outputs, int32_t num_outputs) noexcept {
  return guard([&] {
    if (num_inputs < 3 || num_outputs < 1)
      invalid("fused attention forward: needs inputs q, k, v and one output");
    const TensorView &q = inputs[0], &k = inputs[1], &v = inputs[2];
    expect(q, {-1, -1, -1, -1}, dtype_, "q");
    int64_t b = q.shape[0], t = q.shape[1], h = q.shape[2], d = q.shape[3];
    expect(k, {b, -1, -1, d}, dtype_, "k");
    int64_t s = k.shape[1], g = k.shape[2];
    expect(v, {b, s, g, d}, dtype_, "v");
    if (g < 1 || h % g != 0)
      invalid(detail::concat("fused attention: ", h, " query heads are not a multiple of ", g,
                             " key/value groups"));
    TensorView segments = num_inputs > 3 ? inputs[3] : TensorView{};
    if (segments.data != nullptr) expect(segments, {b, t}, DType::kI32, "segment ids");
    if (num_inputs > 4 && inputs[4].data != nullptr)
      fail(Code::kUnimplemented, "fused attention: an additive bias is not supported");
    TensorView out = alloc(*ctx, dtype_, {b, t, h, d}, device_);
    TensorView lse = alloc(*ctx, DType::kF32, {b, h, t}, device_);
    fwd_({q, k, v, segments}, {out, lse}, attrs(*ctx, d));
    if (ctx->training()) {
      const TensorView* keep[] = {&q, &k, &v, &out, &lse, &segments};
      for (int32_t slot = kQ; slot <= kSegments; ++slot)
        throw_if_error(ctx->save(this, slot, keep[slot]));
    }
    release(*ctx, lse);  // kept by the save in training
    outputs[0] = out;
  });
}

Status FusedAttention::backward(IForwardContext* ctx, const TensorView* grad_outputs,
                                int32_t num_grad_outputs, TensorView* grad_inputs,
                                int32_t num_grad_inputs) noexcept {
  return guard([&] {
    if (num_grad_outputs < 1 || num_grad_inputs < 3)
      invalid("fused attention backward: needs d(out) and room for dq, dk, dv");
    TensorView saved[kSegments + 1];
    for (int32_t slot = kQ; slot <= kSegments; ++slot)
      throw_if_error(ctx->load(this, slot, &saved[slot]));
    const TensorView &q = saved[kQ], &k = saved[kK], &v = saved[kV];
    expect(grad_outputs[0], {q.shape[0], q.shape[1], q.shape[2], q.shape[3]}, dtype_, "d(out)");
    TensorView dq = alloc(*ctx, dtype_, {q.shape[0], q.shape[1], q.shape[2], q.shape[3]}, device_);
    TensorView dk = alloc(*ctx, dtype_, {k.shape[0], k.shape[1], k.shape[2], k.shape[3]}, device_);
    TensorView dv = alloc(*ctx, dtype_, {v.shape[0], v.shape[1], v.shape[2], v.shape[3]}, device_);
    bwd_({grad_outputs[0], q, k, v, saved[kOut], saved[kLse], saved[kSegments]}, {dq, dk, dv},
         attrs(*ctx, q.shape[3]));
    grad_inputs[0] = dq;
    grad_inputs[1] = dk;
    grad_inputs[2] = dv;
    drop_saved(*ctx, this);  // q, k, v, out and lse served this backward only
  });
}

}  // namespace loom::fused_attention
