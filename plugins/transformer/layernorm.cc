#include "plugins/transformer/layernorm.h"

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {
enum Slot : int32_t { kInput, kMean, kRstd };
}  // namespace

LayerNorm::LayerNorm(const nlohmann::json& options, IBuildContext& ctx)
    : hidden_(inherited<int64_t>(options, "hidden_size", "layernorm")),
      attrs_{options.at("eps").get<float>(), options.at("zero_centered_gamma").get<bool>()},
      dtype_(params_dtype(options)),
      device_(device_of(options)) {
  if (hidden_ < 1) invalid("/hidden_size: must be >= 1, got " + std::to_string(hidden_));
  ParamSpec spec{{hidden_},
                 -1,
                 kParamNoWeightDecay | (inherited_or<bool>(options, "sequence_parallel", false)
                                            ? kParamSequenceParallel
                                            : kParamNone),
                 attrs_.zero_centered_gamma ? ParamInit::kZeros : ParamInit::kOnes,
                 0.f};
  weight_ = add_param("weight", dtype_, spec);
  spec.init = ParamInit::kZeros;
  bias_ = add_param("bias", dtype_, spec);
  fwd_ = Kernel(*ctx.host(), ops::kLayerNormFwd, device_, dtype_);
  bwd_ = Kernel(*ctx.host(), ops::kLayerNormBwd, device_, dtype_);
}

void LayerNorm::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                            TensorView* outputs, int32_t num_outputs) {
  expect_count("layernorm forward inputs", num_inputs, 1);
  expect_count("layernorm forward outputs", num_outputs, 1);
  const TensorView& x = inputs[0];
  if (x.ndim < 1 || x.shape[x.ndim - 1] != hidden_ || x.dtype != dtype_ || !is_contiguous(x))
    fail(Code::kInvalidArgument,
         detail::concat("layernorm input: expected contiguous ", dtype_name(dtype_), " (..., ",
                        hidden_, "), got ", dtype_name(x.dtype), shape_string(x)));
  TensorView y = allocate_like(ctx, x);
  int64_t n = numel(x) / hidden_;
  TensorView mean = allocate(ctx, DType::kF32, {n}, device_);
  TensorView rstd = allocate(ctx, DType::kF32, {n}, device_);
  fwd_({rows(x, hidden_), value(weight_), value(bias_)}, {rows(y, hidden_), mean, rstd}, attrs_);
  if (ctx.training()) {
    save(ctx, this, kInput, x);
    save(ctx, this, kMean, mean);
    save(ctx, this, kRstd, rstd);
  }
  release_all(ctx, {mean, rstd});  // kept by the saves in training
  outputs[0] = y;
}

void LayerNorm::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                             int32_t num_grad_outputs, TensorView* grad_inputs,
                             int32_t num_grad_inputs) {
  expect_count("layernorm backward grad outputs", num_grad_outputs, 1);
  expect_count("layernorm backward grad inputs", num_grad_inputs, 1);
  TensorView x = load(ctx, this, kInput);
  const TensorView& dy = grad_outputs[0];
  expect(dy, std::vector<int64_t>(x.shape, x.shape + x.ndim), dtype_, "layernorm grad output");
  TensorView dx = allocate_like(ctx, x);
  bwd_({rows(dy, hidden_), rows(x, hidden_), value(weight_), load(ctx, this, kMean),
        load(ctx, this, kRstd)},
       {rows(dx, hidden_), grad(weight_), grad(bias_)}, attrs_);
  grad_inputs[0] = dx;
}

}  // namespace loom::transformer
