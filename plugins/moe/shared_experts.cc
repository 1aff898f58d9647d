#include "plugins/moe/shared_experts.h"

#include <cmath>
#include <numeric>

namespace loom::moe {
namespace {

enum Slot : int32_t { kInput, kFc1Out, kActOut, kOut, kGateLogits, kGate, kGateIds, kRowIds };

// The gate's sigmoid is moe_topk over one "expert" with the sigmoid score (K = 1: s itself).
constexpr ops::MoeTopkAttrs kSigmoid{1, 1, 0, 1, 1, 1.0f};

}  // namespace

SharedExperts::SharedExperts(const nlohmann::json& options, IHost& host)
    : host_(host),
      swiglu_(options.at("activation").get<std::string>() == "swiglu"),
      gelu_tanh_(options.at("activation").get<std::string>() == "gelu_tanh"),
      gated_(options.value("gate", false)),
      hidden_(options.at("hidden_size").get<int64_t>()),
      ffn_(options.at("ffn_hidden_size").get<int64_t>()),
      dtype_(params_dtype(options)),
      device_(device_of(options)),
      tp_(host, device_, dtype_, options.value("sequence_parallel", false)),
      linear_(host, device_, dtype_) {
  local_ffn_ = tp_.split(ffn_, "/shared_expert_intermediate_size");
  const float init_std = options.at("init_std").get<float>();
  const int64_t layers = options.at("num_layers").get<int64_t>();
  const float out_std = static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(layers)));
  const int32_t p = tp_.size();
  // fc1's and fc2's weight gradients: one GEMM each writes the whole gradient, asking the
  // context first whether it is the step's first write (kParamGradOverwrite).
  fc1_ =
      add_param("linear_fc1.weight", dtype_,
                ParamSpec{swiglu_ ? std::vector<int64_t>{2, ffn_, hidden_}
                                  : std::vector<int64_t>{ffn_, hidden_},
                          swiglu_ ? 1 : 0, kParamGradOverwrite, ParamInit::kNormal, init_std, p});
  fc2_ = add_param(
      "linear_fc2.weight", dtype_,
      ParamSpec{{hidden_, ffn_}, 1, kParamGradOverwrite, ParamInit::kScaledNormal, out_std, p});
  if (gated_)
    gate_ = add_param("gate_weight", dtype_,
                      ParamSpec{{1, hidden_},
                                -1,
                                tp_.sequence_parallel() ? kParamSequenceParallel : kParamNone,
                                ParamInit::kNormal,
                                init_std});
  act_fwd_ = Kernel(host_, swiglu_ ? ops::kSwigluFwd : ops::kGeluFwd, device_, dtype_);
  act_bwd_ = Kernel(host_, swiglu_ ? ops::kSwigluBwd : ops::kGeluBwd, device_, dtype_);
  if (gated_) {
    gemm_ = Kernel(host_, ops::kGemm, device_, dtype_);
    sigmoid_ = Kernel(host_, ops::kMoeTopk, device_, DType::kF32);
    sigmoid_bwd_ = Kernel(host_, ops::kMoeTopkBwd, device_, DType::kF32);
    scale_rows_ = Kernel(host_, ops::kMoeUnpermute, device_, dtype_);
    scale_rows_bwd_ = Kernel(host_, ops::kMoeUnpermuteBwd, device_, dtype_);
    add_ = Kernel(host_, ops::kAdd, device_, dtype_);
    if (dtype_ != DType::kF32) cast_ = Kernel(host_, ops::kCast, device_, DType::kF32);
  }
}

void SharedExperts::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                                TensorView* outputs, int32_t num_outputs) {
  expect_count("shared experts forward inputs", num_inputs, 1);
  expect_count("shared experts forward outputs", num_outputs, 1);
  const TensorView& x_in = inputs[0];
  expect(x_in, {-1, -1, hidden_}, dtype_, "shared experts input");
  TensorView x = tp_.enter(ctx, x_in);  // the whole sequence with sequence parallelism
  const int64_t n = numel(x) / hidden_, f1 = swiglu_ ? 2 * local_ffn_ : local_ffn_;
  TensorView h1 = allocate(ctx, dtype_, {n, f1}, device_);  // (N, F | 2F)
  linear_.forward(rows(x, hidden_), rows(value(fc1_), hidden_), empty_view(), h1);
  TensorView a = allocate(ctx, dtype_, {n, local_ffn_}, device_);  // (N, F)
  if (swiglu_)
    act_fwd_({h1}, {a});
  else
    act_fwd_({h1}, {a}, ops::GeluAttrs{gelu_tanh_ ? 1 : 0});
  TensorView y_partial = allocate_like(ctx, x);
  linear_.forward(a, value(fc2_), empty_view(), rows(y_partial, hidden_));
  TensorView y = tp_.exit(ctx, y_partial);  // summed over the group: like x_in
  if (ctx.training()) {
    save(ctx, this, kInput, x);
    save(ctx, this, kFc1Out, h1);
    save(ctx, this, kActOut, a);
  }
  release_all(ctx, {x, h1, a, y_partial}, {x_in, y});
  if (!gated_) {
    outputs[0] = y;
    return;
  }
  // y * sigmoid(x . gate_weight) on this rank's own tokens.
  const int64_t t = numel(x_in) / hidden_;
  TensorView logits = allocate(ctx, DType::kF32, {t, 1}, device_);
  gemm_({rows(x_in, hidden_), value(gate_)}, {logits}, ops::GemmAttrs{0, 1, 1.0f, 0.0f});
  TensorView gate = allocate(ctx, DType::kF32, {t, 1}, device_);
  TensorView ids = allocate(ctx, DType::kI32, {t, 1}, device_);
  sigmoid_({logits, empty_view()}, {gate, ids, empty_view()}, kSigmoid);
  std::vector<int32_t> id(static_cast<size_t>(t));
  std::iota(id.begin(), id.end(), 0);
  TensorView row_ids = upload(ctx, host_, DType::kI32, {t}, id, device_);
  TensorView out = allocate_like(ctx, x_in);
  scale_rows_({rows(y, hidden_), reshape(row_ids, {t, 1}), gate}, {rows(out, hidden_)});
  if (ctx.training()) {
    save(ctx, this, kOut, y);
    save(ctx, this, kGateLogits, logits);
    save(ctx, this, kGate, gate);
    save(ctx, this, kGateIds, ids);
    save(ctx, this, kRowIds, row_ids);
    save(ctx, this, kInput + 100, x_in);
  }
  release_all(ctx, {y, logits, gate, ids, row_ids}, {x_in});
  outputs[0] = out;
}

void SharedExperts::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                                 int32_t num_grad_outputs, TensorView* grad_inputs,
                                 int32_t num_grad_inputs) {
  expect_count("shared experts backward grad outputs", num_grad_outputs, 1);
  expect_count("shared experts backward grad inputs", num_grad_inputs, 1);
  TensorView dy_in = grad_outputs[0];
  TensorView dgated{}, dx_gate{};
  if (gated_) {
    TensorView y = load(ctx, this, kOut), logits = load(ctx, this, kGateLogits);
    TensorView gate = load(ctx, this, kGate), ids = load(ctx, this, kGateIds);
    TensorView row_ids = load(ctx, this, kRowIds), x_own = load(ctx, this, kInput + 100);
    const int64_t t = logits.shape[0];
    dgated = allocate_like(ctx, y);
    TensorView dgate = allocate(ctx, DType::kF32, {t, 1}, device_);
    scale_rows_bwd_({rows(dy_in, hidden_), rows(y, hidden_), reshape(row_ids, {t, 1}), gate,
                     row_ids},
                    {rows(dgated, hidden_), dgate});
    TensorView dlogits = allocate(ctx, DType::kF32, {t, 1}, device_);
    sigmoid_bwd_({dgate, logits, ids, empty_view()}, {dlogits}, kSigmoid);
    TensorView dl = dlogits;
    if (dtype_ != DType::kF32) {
      dl = allocate(ctx, dtype_, {t, 1}, device_);
      cast_({dlogits}, {dl});
    }
    gemm_({dl, rows(x_own, hidden_)}, {grad(gate_)}, ops::GemmAttrs{1, 0, 1.0f, 1.0f});
    dx_gate = allocate_like(ctx, x_own);
    gemm_({dl, value(gate_)}, {rows(dx_gate, hidden_)}, ops::GemmAttrs{0, 0, 1.0f, 0.0f});
    release_all(ctx, {dgate, dlogits, dl});
    dy_in = dgated;
  }
  TensorView x = load(ctx, this, kInput), h1 = load(ctx, this, kFc1Out);
  TensorView a = load(ctx, this, kActOut);
  TensorView dy = tp_.exit_backward(ctx, dy_in);
  const int64_t n = numel(h1) / h1.shape[1];
  TensorView da = allocate(ctx, dtype_, {n, local_ffn_}, device_);
  linear_.backward(rows(dy, hidden_), a, value(fc2_), grad(fc2_), empty_view(), da,
                   grad_write_beta(ctx, grad(fc2_)));
  TensorView dh1 = allocate_like(ctx, h1);
  if (swiglu_)
    act_bwd_({da, h1}, {dh1});
  else
    act_bwd_({da, h1}, {dh1}, ops::GeluAttrs{gelu_tanh_ ? 1 : 0});
  TensorView dx_partial = allocate_like(ctx, x);
  linear_.backward(dh1, rows(x, hidden_), rows(value(fc1_), hidden_), rows(grad(fc1_), hidden_),
                   empty_view(), rows(dx_partial, hidden_), grad_write_beta(ctx, grad(fc1_)));
  TensorView dx = tp_.enter_backward(ctx, dx_partial);
  release_all(ctx, {dy, da, dh1, dx_partial}, {dy_in, dx});
  if (gated_) {
    add_({dx, dx_gate}, {dx});
    release_all(ctx, {dgated, dx_gate}, {dx});
  }
  grad_inputs[0] = dx;
}

}  // namespace loom::moe
