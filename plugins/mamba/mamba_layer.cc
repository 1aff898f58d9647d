#include "plugins/mamba/mamba_layer.h"

#include <string>

namespace loom::mamba {
namespace {

enum Slot : int32_t { kInput };
enum Stream : uint64_t { kMixerOutDropout = 1 };

}  // namespace

MambaLayer::MambaLayer(const nlohmann::json& options, IBuildContext& ctx)
    : hidden_(inherited<int64_t>(options, "hidden_size", "mamba_layer")),
      hidden_dropout_(inherited_or<float>(options, "hidden_dropout", 0.f)),
      tp_(*ctx.host(), device_of(options), params_dtype(options),
          inherited_or<bool>(options, "sequence_parallel", false)),
      dtype_(params_dtype(options)),
      device_(device_of(options)) {
  if (hidden_ < 1) invalid("/hidden_size: must be >= 1");
  if (!(hidden_dropout_ >= 0.f && hidden_dropout_ < 1.f))
    invalid("/hidden_dropout: must be in [0, 1)");
  IHost& host = *ctx.host();
  cp_rank_ = group(host, ParallelRole::kContext).rank();
  cp_size_ = group(host, ParallelRole::kContext).size();
  if (cp_size_ > 1)
    invalid("/hybrid_layer_pattern: a Mamba layer (M) cannot run context parallel (parallel.cp = " +
            std::to_string(cp_size_) +
            "): its scan needs the state of every earlier chunk; use parallel.cp 1");
  nlohmann::json common = {{"params_dtype", dtype_name(dtype_)},
                           {"device", device_name(device_)},
                           {"sequence_parallel", tp_.sequence_parallel()},
                           {"hidden_size", hidden_}};
  nlohmann::json mixer = common;
  mixer["init_std"] = inherited<double>(options, "init_std", "mamba_layer");
  mixer["num_layers"] = inherited<int64_t>(options, "num_layers", "mamba_layer");
  mixer["layer_number"] = inherited_or<int64_t>(options, "layer_number", 1);
  add_child("norm", norm_ = build_child<INorm>(ctx, "norm", common));
  add_child("mixer", mixer_ = build_child<IMixer>(ctx, "mixer", mixer));
  add_ = Kernel(host, ops::kAdd, device_, dtype_);
  dropout_fwd_ = Kernel(host, ops::kDropoutFwd, device_, dtype_);
  dropout_bwd_ = Kernel(host, ops::kDropoutBwd, device_, dtype_);
}

void MambaLayer::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                             TensorView* outputs, int32_t num_outputs) {
  expect_count("mamba_layer forward inputs", num_inputs, 1);
  expect_count("mamba_layer forward outputs", num_outputs, 1);
  const TensorView& x = inputs[0];
  expect(x, {-1, -1, hidden_}, dtype_, "mamba_layer hidden");
  if (num_inputs > 2 && present(inputs[2]))
    fail(Code::kInvalidArgument,
         "mamba_layer: segment ids (packed documents) are not supported: the SSM state would "
         "run from one document into the next; train on unpacked sequences (no segment ids)");
  if (ctx.training() && ctx.recompute() == RecomputePolicy::kFull) {
    save(ctx, this, kInput, x);
    ForwardOnlyContext forward_only(ctx);
    outputs[0] = forward_impl(forward_only, x);
  } else {
    outputs[0] = forward_impl(ctx, x);
  }
}

TensorView MambaLayer::forward_impl(IForwardContext& ctx, const TensorView& x) {
  TensorView normed = call_forward(*norm_, ctx, {x}, 1, "norm")[0];
  TensorView mixed = call_forward(*mixer_, ctx, {normed}, 1, "mixer")[0];
  if (ctx.training() && hidden_dropout_ > 0.f) {
    ops::DropoutAttrs attrs{hidden_dropout_, 0, 0};
    ctx.rng(this, kMixerOutDropout, &attrs.key, &attrs.counter);
    dropout_sequence(dropout_fwd_, attrs, mixed, mixed, tp_, cp_rank_, cp_size_);
  }
  TensorView y = allocate_like(ctx, x);
  add_({x, mixed}, {y});
  release_all(ctx, {normed, mixed}, {x});
  return y;
}

void MambaLayer::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                              int32_t num_grad_outputs, TensorView* grad_inputs,
                              int32_t num_grad_inputs) {
  expect_count("mamba_layer backward grad outputs", num_grad_outputs, 1);
  expect_count("mamba_layer backward grad inputs", num_grad_inputs, 1);
  if (ctx.recompute() == RecomputePolicy::kFull) {  // rerun forward, saving this time
    RerunContext rerun(ctx);
    release(ctx, forward_impl(rerun, load(ctx, this, kInput)));
  }
  const TensorView& dy = grad_outputs[0];
  expect(dy, {-1, -1, hidden_}, dtype_, "mamba_layer grad output");
  TensorView dmixed = dy;
  if (ctx.training() && hidden_dropout_ > 0.f) {
    ops::DropoutAttrs attrs{hidden_dropout_, 0, 0};
    ctx.rng(this, kMixerOutDropout, &attrs.key, &attrs.counter);
    dmixed = allocate_like(ctx, dy);
    dropout_sequence(dropout_bwd_, attrs, dy, dmixed, tp_, cp_rank_, cp_size_);
  }
  TensorView dnormed = call_backward(*mixer_, ctx, {dmixed}, 1, "mixer")[0];
  TensorView dx;
  if (norm_->interface_info().minor >= 2) {  // norm 1.2 adds dy into its input gradient
    dx = call_backward(*norm_, ctx, {dnormed, dy}, 1, "norm")[0];
  } else {
    TensorView dx_norm = call_backward(*norm_, ctx, {dnormed}, 1, "norm")[0];
    dx = allocate_like(ctx, dy);
    add_({dy, dx_norm}, {dx});
    release(ctx, dx_norm);
  }
  release_all(ctx, {dmixed, dnormed}, {dy});
  grad_inputs[0] = dx;
  for (int32_t i = 1; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
}

}  // namespace loom::mamba
