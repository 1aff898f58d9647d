#include "plugins/transformer/norm.h"

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {
// kInput is the normalised tensor: x, or z = x + r with a residual.
enum Slot : int32_t { kInput, kMean, kRstd };
}  // namespace

NormModule::NormModule(const nlohmann::json& options, IBuildContext& ctx, bool rms,
                       const char* name)
    : rms_(rms),
      name_(name),
      hidden_(inherited<int64_t>(options, "hidden_size", name)),
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
  if (!rms_) {
    spec.init = ParamInit::kZeros;
    bias_ = add_param("bias", dtype_, spec);
  }
  IHost& host = *ctx.host();
  fwd_ = Kernel(host, rms_ ? ops::kRmsNormFwd : ops::kLayerNormFwd, device_, dtype_);
  bwd_ = Kernel(host, rms_ ? ops::kRmsNormBwd : ops::kLayerNormBwd, device_, dtype_);
  add_fwd_ =
      Kernel::optional(host, rms_ ? ops::kAddRmsNormFwd : ops::kAddLayerNormFwd, device_, dtype_);
  add_bwd_ =
      Kernel::optional(host, rms_ ? ops::kAddRmsNormBwd : ops::kAddLayerNormBwd, device_, dtype_);
  add_ = Kernel(host, ops::kAdd, device_, dtype_);
}

void NormModule::check_input(const TensorView& v, const char* what) const {
  if (v.ndim < 1 || v.shape[v.ndim - 1] != hidden_ || v.dtype != dtype_ || !is_contiguous(v))
    fail(Code::kInvalidArgument,
         detail::concat(name_, " ", what, ": expected contiguous ", dtype_name(dtype_), " (..., ",
                        hidden_, "), got ", dtype_name(v.dtype), shape_string(v)));
}

void NormModule::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                             TensorView* outputs, int32_t num_outputs) {
  const std::string what = std::string(name_) + " forward";
  expect_count((what + " inputs").c_str(), num_inputs, 1);
  expect_count((what + " outputs").c_str(), num_outputs, 1);
  const TensorView& x = inputs[0];
  check_input(x, "input");
  const bool residual = num_inputs > 1 && present(inputs[1]);
  TensorView z = x;  // what is normalised
  if (residual) {
    const TensorView& r = inputs[1];
    expect(r, std::vector<int64_t>(x.shape, x.shape + x.ndim), dtype_,
           (std::string(name_) + " residual (forward input [1], like input [0])").c_str());
    if (num_outputs < 2)
      fail(Code::kInvalidArgument,
           detail::concat(what,
                          ": a residual (input [1]) gives the sum x + r as output [1]; "
                          "ask for 2 outputs"));
    z = allocate_like(ctx, x);
  }
  TensorView y = allocate_like(ctx, x);
  const int64_t n = numel(x) / hidden_;
  TensorView mean = rms_ ? empty_view() : allocate(ctx, DType::kF32, {n}, device_);
  TensorView rstd = allocate(ctx, DType::kF32, {n}, device_);
  const TensorView bias = rms_ ? empty_view() : value(bias_);
  if (residual && add_fwd_) {  // z = x + r and the norm of z, in one kernel
    const TensorView xr = rows(x, hidden_), rr = rows(inputs[1], hidden_);
    if (rms_)
      add_fwd_({xr, rr, value(weight_)}, {rows(y, hidden_), rows(z, hidden_), rstd}, attrs_);
    else
      add_fwd_({xr, rr, value(weight_), bias}, {rows(y, hidden_), rows(z, hidden_), mean, rstd},
               attrs_);
  } else {
    if (residual) add_({x, inputs[1]}, {z});
    if (rms_)
      fwd_({rows(z, hidden_), value(weight_)}, {rows(y, hidden_), rstd}, attrs_);
    else
      fwd_({rows(z, hidden_), value(weight_), bias}, {rows(y, hidden_), mean, rstd}, attrs_);
  }
  if (ctx.training()) {
    save(ctx, this, kInput, z);
    if (!rms_) save(ctx, this, kMean, mean);
    save(ctx, this, kRstd, rstd);
  }
  release_all(ctx, {mean, rstd});  // kept by the saves in training
  outputs[0] = y;
  if (num_outputs > 1) outputs[1] = residual ? z : empty_view();
  for (int32_t i = 2; i < num_outputs; ++i) outputs[i] = empty_view();
}

void NormModule::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                              int32_t num_grad_outputs, TensorView* grad_inputs,
                              int32_t num_grad_inputs) {
  const std::string what = std::string(name_) + " backward";
  expect_count((what + " grad outputs").c_str(), num_grad_outputs, 1);
  expect_count((what + " grad inputs").c_str(), num_grad_inputs, 1);
  TensorView z = load(ctx, this, kInput);
  const std::vector<int64_t> shape(z.shape, z.shape + z.ndim);
  const TensorView& dy = grad_outputs[0];
  expect(dy, shape, dtype_, (std::string(name_) + " grad output").c_str());
  const bool other = num_grad_outputs > 1 && present(grad_outputs[1]);
  if (other)
    expect(
        grad_outputs[1], shape, dtype_,
        (std::string(name_) + " grad output [1] (the input's gradient by its other path)").c_str());
  const TensorView mean = rms_ ? empty_view() : load(ctx, this, kMean);
  const TensorView rstd = load(ctx, this, kRstd);
  const TensorView dbias = rms_ ? empty_view() : grad(bias_);
  TensorView dx = allocate_like(ctx, z);
  const TensorView dyr = rows(dy, hidden_), zr = rows(z, hidden_), dxr = rows(dx, hidden_);
  if (other && add_bwd_) {  // the norm's gradient plus dz, in one kernel
    const TensorView dzr = rows(grad_outputs[1], hidden_);
    if (rms_)
      add_bwd_({dyr, zr, value(weight_), rstd, dzr}, {dxr, grad(weight_)}, attrs_);
    else
      add_bwd_({dyr, zr, value(weight_), mean, rstd, dzr}, {dxr, grad(weight_), dbias}, attrs_);
  } else {
    if (rms_)
      bwd_({dyr, zr, value(weight_), rstd}, {dxr, grad(weight_)}, attrs_);
    else
      bwd_({dyr, zr, value(weight_), mean, rstd}, {dxr, grad(weight_), dbias}, attrs_);
    if (other) add_({dx, grad_outputs[1]}, {dx});
  }
  grad_inputs[0] = dx;
  // r's gradient is x's (they enter as a sum): [0] serves both, further ones are empty.
  for (int32_t i = 1; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
}

}  // namespace loom::transformer
