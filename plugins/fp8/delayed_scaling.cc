#include "plugins/fp8/delayed_scaling.h"

#include <string>

namespace loom::fp8 {

DelayedScaling::DelayedScaling(const nlohmann::json& options, IBuildContext& ctx)
    : ScalingRecipe(options, ctx),
      history_len_(options.value("amax_history_len", 1024)),
      algo_(options.value("amax_compute_algo", "max") == "most_recent" ? 1 : 0) {
  if (history_len_ < 1 || history_len_ > 65536)
    fail(Code::kInvalidArgument, "/amax_history_len: must be in [1, 65536], e.g. 1024");
  std::string algo = options.value("amax_compute_algo", "max");
  if (algo != "max" && algo != "most_recent")
    fail(Code::kInvalidArgument,
         "/amax_compute_algo: '" + algo + "' is not one of max, most_recent");
}

void DelayedScaling::allocate_state() {
  // history (L, Q), zeros; scale and scale_inv (Q), ones: the first step quantises unscaled.
  history_ = device_f32({history_len_, quantizer_count()}, 0.0f);
  scale_ = device_f32({quantizer_count()}, 1.0f);
  scale_inv_ = device_f32({quantizer_count()}, 1.0f);
}

void DelayedScaling::quantize_impl(int32_t id, const TensorView& x, const TensorView& y,
                                   const TensorView& yt, const TensorView& scale_inv,
                                   void* stream) {
  TensorView amax_slot = element(history_, int64_t{current_} * quantizer_count() + id);
  quantize_kernel(x.dtype)({x, element(scale_, id)}, {y, yt, amax_slot}, stream);
  copy_scale_inv(element(scale_inv_, id), scale_inv, stream);
}

Status DelayedScaling::step_end(ICommunicator* amax_group, void* stream) noexcept {
  return guard([&] {
    if (!started()) return;  // nothing quantised yet: every scale stays 1
    if (amax_group != nullptr) {
      TensorView row = make_view(static_cast<float*>(history_.data) +
                                     int64_t{current_} * quantizer_count(),
                                 DType::kF32, {quantizer_count()}, device());
      throw_if_error(amax_group->all_reduce(&row, ReduceOp::kMax, stream),
                     "fp8 delayed scaling: the amax all-reduce (max)");
    }
    const int32_t next = (current_ + 1) % history_len_;
    scale_update_kernel()({fp8_max()}, {history_, scale_, scale_inv_},
                          ops::Fp8ScaleAttrs{algo_, current_, next, margin()}, stream);
    current_ = next;
  });
}

}  // namespace loom::fp8
