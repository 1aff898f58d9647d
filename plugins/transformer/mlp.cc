#include "plugins/transformer/mlp.h"

#include <cmath>

#include "plugins/transformer/options.h"
#include "plugins/transformer/views.h"

namespace loom::transformer {
namespace {

enum Slot : int32_t { kInput, kFc1Out, kActOut };

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
      fc1_out_(activation_ == Activation::kSwiglu ? 2 * ffn_ : ffn_),
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

  // Column-parallel fc1 (split over its output rows), row-parallel fc2 (over its inputs).
  fc1_weight_ =
      add_param("linear_fc1.weight", dtype_,
                ParamSpec{{fc1_out_, hidden_}, 0, kParamNone, ParamInit::kNormal, init_std});
  if (bias_)
    fc1_bias_ = add_param("linear_fc1.bias", dtype_,
                          ParamSpec{{fc1_out_}, 0, kParamNoWeightDecay, ParamInit::kZeros, 0.f});
  fc2_weight_ =
      add_param("linear_fc2.weight", dtype_,
                ParamSpec{{hidden_, ffn_}, 1, kParamNone, ParamInit::kScaledNormal, out_std});
  if (bias_)
    fc2_bias_ = add_param("linear_fc2.bias", dtype_,
                          ParamSpec{{hidden_}, -1, kParamNoWeightDecay, ParamInit::kZeros, 0.f});

  IHost& host = *ctx.host();
  bool swiglu = activation_ == Activation::kSwiglu;
  act_fwd_ = Kernel(host, swiglu ? ops::kSwigluFwd : ops::kGeluFwd, device_, dtype_);
  act_bwd_ = Kernel(host, swiglu ? ops::kSwigluBwd : ops::kGeluBwd, device_, dtype_);
}

void Mlp::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                      TensorView* outputs, int32_t num_outputs) {
  expect_count("mlp forward inputs", num_inputs, 1);
  expect_count("mlp forward outputs", num_outputs, 1);
  const TensorView& x = inputs[0];
  if (x.ndim < 1 || x.shape[x.ndim - 1] != hidden_ || x.dtype != dtype_ || !is_contiguous(x))
    fail(Code::kInvalidArgument,
         detail::concat("mlp input: expected contiguous ", dtype_name(dtype_), " (..., ", hidden_,
                        "), got ", dtype_name(x.dtype), shape_string(x)));
  int64_t n = numel(x) / hidden_;
  TensorView h1 = allocate(ctx, dtype_, {n, fc1_out_}, device_);  // (N, F | 2F)
  linear_.forward(rows(x, hidden_), value(fc1_weight_), bias_ ? value(fc1_bias_) : empty_view(),
                  h1);
  TensorView a = allocate(ctx, dtype_, {n, ffn_}, device_);  // (N, F)
  if (activation_ == Activation::kSwiglu)
    act_fwd_({h1}, {a});
  else
    act_fwd_({h1}, {a}, ops::GeluAttrs{activation_ == Activation::kGeluTanh ? 1 : 0});
  TensorView y = allocate_like(ctx, x);
  linear_.forward(a, value(fc2_weight_), bias_ ? value(fc2_bias_) : empty_view(), rows(y, hidden_));
  if (ctx.training()) {
    save(ctx, this, kInput, x);
    save(ctx, this, kFc1Out, h1);
    save(ctx, this, kActOut, a);
  }
  outputs[0] = y;
}

void Mlp::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                       int32_t num_grad_outputs, TensorView* grad_inputs, int32_t num_grad_inputs) {
  expect_count("mlp backward grad outputs", num_grad_outputs, 1);
  expect_count("mlp backward grad inputs", num_grad_inputs, 1);
  TensorView x = load(ctx, this, kInput), h1 = load(ctx, this, kFc1Out);
  TensorView a = load(ctx, this, kActOut);
  const TensorView& dy = grad_outputs[0];
  expect(dy, std::vector<int64_t>(x.shape, x.shape + x.ndim), dtype_, "mlp grad output");
  int64_t n = numel(x) / hidden_;
  TensorView da = allocate(ctx, dtype_, {n, ffn_}, device_);
  linear_.backward(rows(dy, hidden_), a, value(fc2_weight_), grad(fc2_weight_),
                   bias_ ? grad(fc2_bias_) : empty_view(), da);
  TensorView dh1 = allocate(ctx, dtype_, {n, fc1_out_}, device_);
  if (activation_ == Activation::kSwiglu)
    act_bwd_({da, h1}, {dh1});
  else
    act_bwd_({da, h1}, {dh1}, ops::GeluAttrs{activation_ == Activation::kGeluTanh ? 1 : 0});
  TensorView dx = allocate_like(ctx, x);
  linear_.backward(dh1, rows(x, hidden_), value(fc1_weight_), grad(fc1_weight_),
                   bias_ ? grad(fc1_bias_) : empty_view(), rows(dx, hidden_));
  grad_inputs[0] = dx;
}

}  // namespace loom::transformer
