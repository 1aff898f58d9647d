#include "plugins/fp8/delayed_scaling.h"

#include <string>

namespace loom::fp8 {

DelayedScaling::DelayedScaling(const nlohmann::json& options, IBuildContext& ctx)
    : ScalingRecipe(options, ctx), history_len_(options.value("amax_history_len", 1024)) {
  if (history_len_ < 1 || history_len_ > 65536)
    fail(Code::kInvalidArgument, "/amax_history_len: must be in [1, 65536], e.g. 1024");
  const std::string algo = options.value("amax_compute_algo", "max");
  if (algo != "max" && algo != "most_recent")
    fail(Code::kInvalidArgument,
         "/amax_compute_algo: '" + algo + "' is not one of max, most_recent");
  algo_ = algo == "most_recent" ? 1 : 0;
}

void DelayedScaling::allocate_state() {
  // history (L, Q), zeros; scale and scale_inv (Q), ones: the first step quantises unscaled.
  history_ = device_f32({history_len_, quantizer_count()}, 0.0f);
  scale_ = device_f32({quantizer_count()}, 1.0f);
  scale_inv_ = device_f32({quantizer_count()}, 1.0f);
  position_ = device_f32({1}, 0.0f);
  amax_now_ = device_f32({quantizer_count()}, 0.0f);
}

Status DelayedScaling::state(int32_t index, Device device, const char** name,
                             TensorView* view) noexcept {
  return guard([&] {
    if (name == nullptr || view == nullptr)
      fail(Code::kInvalidArgument, "fp8 delayed scaling: state: null name or view");
    static const char* const kNames[] = {"amax_history", "scale", "scale_inv", "history_position"};
    if (index < 0 || index >= state_count())
      fail(Code::kOutOfRange, "fp8 delayed scaling: no state tensor " + std::to_string(index));
    start(device);
    const TensorView* views[] = {&history_, &scale_, &scale_inv_, &position_};
    *name = kNames[index];
    *view = *views[index];
    reread_position_ = true;
  });
}

void DelayedScaling::sync_position() {
  if (!reread_position_) return;
  reread_position_ = false;
  float position = 0;
  throw_if_error(host().copy(kCpu, &position, device(), position_.data, 4),
                 "fp8 delayed scaling: reading the history position");
  if (!(position >= 0 && position < static_cast<float>(history_len_)) ||
      position != static_cast<float>(static_cast<int32_t>(position)))
    fail(Code::kInvalidArgument,
         "fp8 delayed scaling: history_position " + std::to_string(position) +
             " is not a row of the amax history of " + std::to_string(history_len_) +
             " (a checkpoint saved with another amax_history_len?)");
  current_ = static_cast<int32_t>(position);
}

void DelayedScaling::quantize_impl(int32_t id, const TensorView& x, const TensorView& y,
                                   const TensorView& yt, const TensorView& scale_inv, bool record,
                                   void* stream) {
  TensorView scale{}, amax_slot{};
  producer_impl(id, empty_view(), record, stream, &scale, &amax_slot);
  // The kernel writes scale_inv = 1 / scale: the bits of this quantiser's scale_inv state
  // (fp8_scale_update's same division), without a copy kernel of its own.
  quantize_kernel(x.dtype)({x, scale}, {y, yt, amax_slot, scale_inv}, stream);
}

void DelayedScaling::producer_impl(int32_t id, const TensorView& scale_inv, bool record,
                                   void* stream, TensorView* scale, TensorView* amax) {
  *scale = element(scale_, id);
  *amax = record ? element(amax_now_, id) : empty_view();
  if (present(scale_inv)) copy_scale_inv(element(scale_inv_, id), scale_inv, stream);
}

Status DelayedScaling::step_end(ICommunicator* amax_group, void* stream) noexcept {
  return guard([&] {
    if (!started()) return;  // nothing quantised yet: every scale stays 1
    sync_position();
    TensorView row =
        make_view(static_cast<float*>(history_.data) + int64_t{current_} * quantizer_count(),
                  DType::kF32, {quantizer_count()}, device());
    const uint64_t bytes = static_cast<uint64_t>(quantizer_count()) * 4;
    throw_if_error(host().copy(device(), row.data, device(), amax_now_.data, bytes),
                   "fp8 delayed scaling: recording the step's amaxes");
    throw_if_error(host().fill_zero(device(), amax_now_.data, bytes),
                   "fp8 delayed scaling: clearing the step's amaxes");
    if (amax_group != nullptr) {
      throw_if_error(amax_group->all_reduce(&row, ReduceOp::kMax, stream),
                     "fp8 delayed scaling: the amax all-reduce (max)");
    }
    const int32_t next = (current_ + 1) % history_len_;
    scale_update_kernel()({fp8_max()}, {history_, scale_, scale_inv_},
                          ops::Fp8ScaleAttrs{algo_, current_, next, margin()}, stream);
    current_ = next;
    const float position = static_cast<float>(current_);
    throw_if_error(host().copy(device(), position_.data, kCpu, &position, 4),
                   "fp8 delayed scaling: the history position");
  });
}

}  // namespace loom::fp8
