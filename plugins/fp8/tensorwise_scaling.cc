#include "plugins/fp8/tensorwise_scaling.h"

namespace loom::fp8 {

TensorwiseScaling::TensorwiseScaling(const nlohmann::json& options, IBuildContext& ctx)
    : ScalingRecipe(options, ctx) {}

void TensorwiseScaling::allocate_state() {
  amax_ = device_f32({quantizer_count()}, 0.0f);
  scale_ = device_f32({quantizer_count()}, 1.0f);
  scale_inv_ = device_f32({quantizer_count()}, 1.0f);
}

void TensorwiseScaling::quantize_impl(int32_t id, const TensorView& x, const TensorView& y,
                                      const TensorView& yt, const TensorView& scale_inv,
                                      bool /*record: there is no history*/, void* stream) {
  TensorView amax = element(amax_, id), scale = element(scale_, id);
  TensorView scale_inv_q = element(scale_inv_, id);
  throw_if_error(host().fill_zero(device(), amax.data, 4), "fp8 tensorwise scaling: amax");
  amax_kernel(x.dtype)({x}, {amax}, stream);
  // A one-row history holding this amax: its "most recent" entry gives the scale.
  scale_update_kernel()({element(fp8_max(), id)}, {reshape(amax, {1, 1}), scale, scale_inv_q},
                        ops::Fp8ScaleAttrs{1, 0, -1, margin()}, stream);
  // The kernel writes scale_inv = 1 / scale, the bits scale_update just gave scale_inv_q.
  quantize_kernel(x.dtype)({x, scale}, {y, yt, empty_view(), scale_inv}, stream);
}

Status TensorwiseScaling::step_end(ICommunicator*, void*) noexcept { return ok_status(); }

}  // namespace loom::fp8
