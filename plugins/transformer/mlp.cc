#include "plugins/transformer/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {

enum Slot : int32_t {
  kInput,
  kFc1Out,
  kActOut,
  kFc1Fp8 = 16,
  kFc2Fp8 = kFc1Fp8 + Linear::kSiteSlots
};

std::string activation_name(const nlohmann::json& options) {
  return options.at("activation").get<std::string>();
}

}  // namespace

Mlp::Mlp(const nlohmann::json& options, IBuildContext& ctx)
    : activation_(activation_name(options) == "swiglu"      ? Activation::kSwiglu
                  : activation_name(options) == "gelu_tanh" ? Activation::kGeluTanh
                                                            : Activation::kGelu),
      hidden_(inherited<int64_t>(options, "hidden_size", "mlp")),
      ffn_(inherited<int64_t>(options, "ffn_hidden_size", "mlp")),
      tp_(*ctx.host(), device_of(options), params_dtype(options),
          inherited_or<bool>(options, "sequence_parallel", false)),
      local_ffn_(0),
      fc1_out_(0),
      bias_(inherited<bool>(options, "add_bias_linear", "mlp")),
      dtype_(params_dtype(options)),
      device_(device_of(options)),
      linear_(*ctx.host(), device_, dtype_) {
  std::string act = activation_name(options);
  if (act != "gelu" && act != "gelu_tanh" && act != "swiglu")
    invalid("/activation: '" + act + "' is not one of gelu, gelu_tanh, swiglu");
  if (hidden_ < 1) invalid("/hidden_size: must be >= 1, got " + std::to_string(hidden_));
  if (ffn_ < 1) invalid("/ffn_hidden_size: must be >= 1, got " + std::to_string(ffn_));
  float init_std = inherited<float>(options, "init_std", "mlp");
  int64_t layers = inherited<int64_t>(options, "num_layers", "mlp");
  if (layers < 1) invalid("/num_layers: must be >= 1, got " + std::to_string(layers));
  float out_std = static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(layers)));
  local_ffn_ = tp_.split(ffn_, "/ffn_hidden_size");
  bool swiglu = activation_ == Activation::kSwiglu;
  fc1_out_ = swiglu ? 2 * local_ffn_ : local_ffn_;

  // Column-parallel fc1 (split over its output units; swiglu's gate and up projections are
  // split alike, hence the (2, F, C) shape split on dimension 1), row-parallel fc2 (split
  // over its inputs).
  int32_t p = tp_.size();
  uint32_t sp_flag = tp_.sequence_parallel() ? kParamSequenceParallel : kParamNone;
  std::vector<int64_t> fc1_shape =
      swiglu ? std::vector<int64_t>{2, ffn_, hidden_} : std::vector<int64_t>{ffn_, hidden_};
  int32_t fc1_split = swiglu ? 1 : 0;
  // The weight gradients are written by the Linear sites alone, which ask the context before
  // each write (kParamGradOverwrite).
  fc1_weight_ = add_param(
      "linear_fc1.weight", dtype_,
      ParamSpec{fc1_shape, fc1_split, kParamGradOverwrite, ParamInit::kNormal, init_std, p});
  if (bias_)
    fc1_bias_ =
        add_param("linear_fc1.bias", dtype_,
                  ParamSpec{swiglu ? std::vector<int64_t>{2, ffn_} : std::vector<int64_t>{ffn_},
                            fc1_split, kParamNoWeightDecay, ParamInit::kZeros, 0.f, p});
  fc2_weight_ = add_param(
      "linear_fc2.weight", dtype_,
      ParamSpec{{hidden_, ffn_}, 1, kParamGradOverwrite, ParamInit::kScaledNormal, out_std, p});
  if (bias_)
    fc2_bias_ =
        add_param("linear_fc2.bias", dtype_,
                  ParamSpec{{hidden_}, -1, kParamNoWeightDecay | sp_flag, ParamInit::kZeros, 0.f});

  IHost& host = *ctx.host();
  act_fwd_ = Kernel(host, swiglu ? ops::kSwigluFwd : ops::kGeluFwd, device_, dtype_);
  act_bwd_ = Kernel(host, swiglu ? ops::kSwigluBwd : ops::kGeluBwd, device_, dtype_);
  if (inherited_or<bool>(options, "fp8", true)) {  // FP8 GEMMs when the run has a recipe
    linear_.enable_fp8(ctx, {this, kFc1Fp8});
    linear_.enable_fp8(ctx, {this, kFc2Fp8});
  }
  // Where a fused GELU MLP sums fc1's bias gradient: in fc1's weight-gradient GEMM (the
  // default; Transformer Engine's LayerNormMLP does the same), or in the dgelu GEMM, which
  // on CUDA reads dh1 once more for it (loom's bias_grad after cuBLASLt's DGELU).
  // LOOM_FC1_BIAS_GRAD=dgelu forces the latter, to measure one against the other
  // (tools/gpu_bundle_run.sh).
  if (const char* env = std::getenv("LOOM_FC1_BIAS_GRAD"); env != nullptr && *env != '\0') {
    const std::string mode = env;
    if (mode != "wgrad" && mode != "dgelu")
      fail(Code::kInvalidArgument, "mlp: LOOM_FC1_BIAS_GRAD='" + mode +
                                       "' is not one of wgrad, dgelu (unset it for wgrad)");
    fc1_bias_in_dgelu_ = mode == "dgelu";
  }
  if (swiglu && linear_.fp8({this, kFc2Fp8})) {
    swiglu_fp8_fwd_ = Kernel::optional(host, ops::kSwigluFp8Fwd, device_, dtype_);
    swiglu_fp8_bwd_ = Kernel::optional(host, ops::kSwigluFp8Bwd, device_, dtype_);
  }
}

void Mlp::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                      TensorView* outputs, int32_t num_outputs) {
  expect_count("mlp forward inputs", num_inputs, 1);
  expect_count("mlp forward outputs", num_outputs, 1);
  const TensorView& x_in = inputs[0];
  if (x_in.ndim < 1 || x_in.shape[x_in.ndim - 1] != hidden_ || x_in.dtype != dtype_ ||
      !is_contiguous(x_in))
    fail(Code::kInvalidArgument,
         detail::concat("mlp input: expected contiguous ", dtype_name(dtype_), " (..., ", hidden_,
                        "), got ", dtype_name(x_in.dtype), shape_string(x_in)));
  TensorView x = tp_.enter(ctx, x_in);  // the whole sequence with sequence parallelism
  int64_t n = numel(x) / hidden_;
  TensorView h1 = allocate(ctx, dtype_, {n, fc1_out_}, device_);  // (N, F | 2F)
  // The activation (N, F/P): in the parameter dtype, or straight into FP8 for fc2.
  const bool a_fp8 = quantizes_swiglu();
  TensorView a = a_fp8 ? empty_view() : allocate(ctx, dtype_, {n, local_ffn_}, device_);
  const TensorView fc1_bias = bias_ ? reshape(value(fc1_bias_), {fc1_out_}) : empty_view();
  if (fused_gelu(kFc1Fp8)) {  // h1 = x W1^T + b1 and a = gelu(h1) in one GEMM
    linear_.forward_gelu(rows(x, hidden_), rows(value(fc1_weight_), hidden_), fc1_bias,
                         gelu_approximate(), h1, a);
  } else {
    linear_.forward(ctx, {this, kFc1Fp8}, rows(x, hidden_), rows(value(fc1_weight_), hidden_),
                    fc1_bias, h1);
    if (!a_fp8) {
      if (activation_ == Activation::kSwiglu)
        act_fwd_({h1}, {a});
      else
        act_fwd_({h1}, {a}, ops::GeluAttrs{gelu_approximate()});
    }
  }
  TensorView y_partial = allocate_like(ctx, x);
  // fc2's bias is added to the sum over the group; with one rank that is fc2's own output,
  // so it rides on the GEMM.
  const TensorView fc2_bias = fc2_bias_on_gemm() ? value(fc2_bias_) : empty_view();
  if (a_fp8) {
    const Linear::Fp8Producer aq = linear_.fp8_producer_or_fail(
        ctx, {this, kFc2Fp8}, Fp8Role::kActivation, n, local_ffn_, "mlp");
    swiglu_fp8_fwd_({h1, aq.scale}, {aq.operand.q, aq.operand.t, aq.amax, aq.operand.scale_inv});
    linear_.forward_fp8(ctx, {this, kFc2Fp8}, aq.operand, value(fc2_weight_), fc2_bias,
                        rows(y_partial, hidden_));
  } else {
    linear_.forward(ctx, {this, kFc2Fp8}, a, value(fc2_weight_), fc2_bias,
                    rows(y_partial, hidden_));
  }
  TensorView y = tp_.exit(ctx, y_partial);  // summed over the group: like x_in
  if (bias_ && !fc2_bias_on_gemm()) linear_.add_bias(value(fc2_bias_), rows(y, hidden_));
  if (ctx.training()) {
    // An FP8 site keeps its input's FP8 transpose instead (Linear): x and a only for bf16.
    if (!linear_.fp8({this, kFc1Fp8})) save(ctx, this, kInput, x);
    save(ctx, this, kFc1Out, h1);
    if (!linear_.fp8({this, kFc2Fp8})) save(ctx, this, kActOut, a);
  }
  release_all(ctx, {x, h1, a, y_partial}, {x_in, y});  // the saves keep x, h1, a in training
  outputs[0] = y;
}

void Mlp::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                       int32_t num_grad_outputs, TensorView* grad_inputs, int32_t num_grad_inputs) {
  expect_count("mlp backward grad outputs", num_grad_outputs, 1);
  expect_count("mlp backward grad inputs", num_grad_inputs, 1);
  const bool fc1_fp8 = linear_.fp8({this, kFc1Fp8}), fc2_fp8 = linear_.fp8({this, kFc2Fp8});
  TensorView x = fc1_fp8 ? empty_view() : load(ctx, this, kInput);
  TensorView h1 = load(ctx, this, kFc1Out);
  TensorView a = fc2_fp8 ? empty_view() : load(ctx, this, kActOut);
  const TensorView& dy_in = grad_outputs[0];
  // x's shape: (B, T, C), the whole sequence even with sequence parallelism.
  std::vector<int64_t> x_shape(dy_in.shape, dy_in.shape + dy_in.ndim);
  if (present(x)) {
    x_shape.assign(x.shape, x.shape + x.ndim);
    std::vector<int64_t> y_shape = x_shape;
    if (tp_.sequence_parallel()) y_shape[1] /= tp_.size();
    expect(dy_in, y_shape, dtype_, "mlp grad output");
  } else {
    std::vector<int64_t> any(static_cast<size_t>(std::max(dy_in.ndim, 1)), -1);
    any.back() = hidden_;
    expect(dy_in, any, dtype_, "mlp grad output");
    if (tp_.sequence_parallel()) x_shape[1] = tp_.full_length(x_shape[1]);
  }
  if (bias_ && !fc2_bias_on_gemm()) linear_.bias_grad(rows(dy_in, hidden_), grad(fc2_bias_));
  // Zero-bubble schedules: fc1's and fc2's weight gradients wait for backward_weight.
  const void* deferred = weight_grads_deferred(ctx) ? deferred_owner() : nullptr;
  TensorView dy = tp_.exit_backward(ctx, dy_in);
  int64_t n = numel(h1) / fc1_out_;
  // d(fc1 out) (N, F | 2F): in the parameter dtype, or straight into FP8 for fc1's GEMMs.
  const bool dh1_fp8 = quantizes_swiglu_grad();
  TensorView dh1 = dh1_fp8 ? empty_view() : allocate(ctx, dtype_, {n, fc1_out_}, device_);
  Linear::Fp8Operand dh1q{};
  TensorView da{};
  // fc1's bias gradient: from dh1 in fc1's weight pass (which reduces dh1 while it reads it
  // as an operand), or, with fc1_bias_in_dgelu_, in dgelu's GEMM when the weight pass runs now.
  TensorView fc1_dbias = fc1_bias_grad();
  if (fused_gelu(kFc2Fp8)) {
    // fc2's weight gradient, then dh1 = gelu'(h1) * (dy W2) in one GEMM.
    linear_.backward(ctx, {this, kFc2Fp8}, rows(dy, hidden_), a, value(fc2_weight_),
                     grad(fc2_weight_), fc2_bias_grad(), empty_view(), deferred);
    const bool in_dgelu = fc1_bias_in_dgelu_ && !deferred;
    linear_.backward_dgelu(rows(dy, hidden_), value(fc2_weight_), h1, gelu_approximate(),
                           in_dgelu ? fc1_dbias : empty_view(), dh1);
    if (in_dgelu) fc1_dbias = empty_view();
  } else {
    da = allocate(ctx, dtype_, {n, local_ffn_}, device_);
    linear_.backward(ctx, {this, kFc2Fp8}, rows(dy, hidden_), a, value(fc2_weight_),
                     grad(fc2_weight_), fc2_bias_grad(), da, deferred);
    if (dh1_fp8) {
      const Linear::Fp8Producer q = linear_.fp8_producer_or_fail(
          ctx, {this, kFc1Fp8}, Fp8Role::kGradOutput, n, fc1_out_, "mlp");
      swiglu_fp8_bwd_({da, h1, q.scale}, {q.operand.q, q.operand.t, q.amax, q.operand.scale_inv});
      dh1q = q.operand;
    } else if (activation_ == Activation::kSwiglu) {
      act_bwd_({da, h1}, {dh1});
    } else {
      act_bwd_({da, h1}, {dh1}, ops::GeluAttrs{gelu_approximate()});
    }
  }
  TensorView dx_partial{};
  throw_if_error(ctx.allocate(dtype_, static_cast<int32_t>(x_shape.size()), x_shape.data(), device_,
                              &dx_partial),
                 "mlp backward");
  if (dh1_fp8) {
    linear_.backward_fp8(ctx, {this, kFc1Fp8}, dh1q, rows(grad(fc1_weight_), hidden_),
                         rows(dx_partial, hidden_), deferred);
  } else {
    linear_.backward(ctx, {this, kFc1Fp8}, dh1, present(x) ? rows(x, hidden_) : empty_view(),
                     rows(value(fc1_weight_), hidden_), rows(grad(fc1_weight_), hidden_), fc1_dbias,
                     rows(dx_partial, hidden_), deferred);
  }
  grad_inputs[0] = tp_.enter_backward(ctx, dx_partial);
  release_all(ctx, {dy, da, dh1, dx_partial}, {dy_in, grad_inputs[0]});
}

void Mlp::run_backward_weight(IForwardContext& ctx) {
  linear_.backward_weight(ctx, {this, kFc2Fp8}, deferred_owner(), grad(fc2_weight_),
                          fc2_bias_grad());
  linear_.backward_weight(ctx, {this, kFc1Fp8}, deferred_owner(), rows(grad(fc1_weight_), hidden_),
                          fc1_bias_grad());
}

TensorView Mlp::fc1_bias_grad() const {
  return bias_ ? reshape(grad(fc1_bias_), {fc1_out_}) : empty_view();
}

bool Mlp::fc2_bias_on_gemm() const { return bias_ && tp_.size() == 1; }

TensorView Mlp::fc2_bias_grad() const {
  return fc2_bias_on_gemm() ? grad(fc2_bias_) : empty_view();
}

bool Mlp::fused_gelu(int32_t site) const {
  return activation_ != Activation::kSwiglu && linear_.fuses_activation({this, site});
}

int32_t Mlp::gelu_approximate() const { return activation_ == Activation::kGeluTanh ? 1 : 0; }

bool Mlp::quantizes_swiglu() const {
  return swiglu_fp8_fwd_ && linear_.fp8_produces({this, kFc2Fp8});
}

bool Mlp::quantizes_swiglu_grad() const {
  return !bias_ && swiglu_fp8_bwd_ && linear_.fp8_produces({this, kFc1Fp8});
}

}  // namespace loom::transformer
