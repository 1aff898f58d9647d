// hello: the example loom plugin, built out of tree against the installed SDK only
// (README.md says how, with CMake or Bazel).
//
// It provides one component, the norm `scale_norm`: y = x * scale, elementwise, on
// contiguous f32 (..., C) tensors on the CPU. It is written on the SDK's module toolkit
// (loom/cpp/nn.h): loom::nn::ModuleBase does the IModule bookkeeping (parameters, children,
// the boundary's statuses, the per-step hook and split backward), so the norm writes only
// its constructor, forward and backward. It has no parameters, so its backward is just
// grad_x = grad_y * scale and it saves nothing for backward. Its option schema is in
// manifest.json, which the build embeds into the library and copies beside it as
// plugin.json; the registration below reads the description and schema from there.
#include <loom/cpp/nn.h>
#include <loom/sdk.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace {

// out = in * scale; both (N,) contiguous f32.
void scale_f32(const float* in, float scale, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale;
}

class ScaleNorm final : public loom::nn::ModuleBase<loom::INorm> {
 public:
  // `options` is the spec node, validated against the manifest's schema with defaults
  // filled in: {"impl": "scale_norm", "scale": 1.0}. A message that starts with "/key: "
  // names that option: loom reports it at the node's place in the spec
  // ("spec /model/final_norm/scale: ...").
  ScaleNorm(const nlohmann::json& options, loom::IBuildContext&)
      : scale_(options.value("scale", 1.0)) {
    if (!(scale_ > 0.0))  // the schema says so too; a direct caller may skip validation
      loom::nn::invalid("/scale: expected a number > 0, got " + std::to_string(scale_));
  }

 private:
  // inputs[0] x (..., C) f32 on the CPU -> outputs[0] y (..., C) f32, y = x * scale.
  void run_forward(loom::IForwardContext& ctx, const loom::TensorView* inputs, int32_t num_inputs,
                   loom::TensorView* outputs, int32_t num_outputs) override {
    loom::nn::expect_count("scale_norm forward inputs", num_inputs, 1);
    loom::nn::expect_count("scale_norm forward outputs", num_outputs, 1);
    const loom::TensorView& x = inputs[0];  // (..., C)
    check_cpu_f32(x, "scale_norm input");
    outputs[0] = loom::nn::allocate_like(ctx, x);  // (..., C)
    scale_f32(static_cast<const float*>(x.data), static_cast<float>(scale_), loom::numel(x),
              static_cast<float*>(outputs[0].data));
  }

  // grad_outputs[0] dy (..., C) -> grad_inputs[0] dx (..., C), dx = dy * scale.
  void run_backward(loom::IForwardContext& ctx, const loom::TensorView* grad_outputs,
                    int32_t num_grad_outputs, loom::TensorView* grad_inputs,
                    int32_t num_grad_inputs) override {
    loom::nn::expect_count("scale_norm backward grad outputs", num_grad_outputs, 1);
    loom::nn::expect_count("scale_norm backward grad inputs", num_grad_inputs, 1);
    const loom::TensorView& dy = grad_outputs[0];  // (..., C)
    check_cpu_f32(dy, "scale_norm grad output");
    grad_inputs[0] = loom::nn::allocate_like(ctx, dy);  // (..., C)
    scale_f32(static_cast<const float*>(dy.data), static_cast<float>(scale_), loom::numel(dy),
              static_cast<float*>(grad_inputs[0].data));
  }

  // Refuses anything but a contiguous f32 CPU tensor of rank >= 1, saying what to use instead.
  static void check_cpu_f32(const loom::TensorView& view, const char* what) {
    if (view.dtype != loom::DType::kF32)
      loom::fail(loom::Code::kUnimplemented,
                 std::string(what) + " is " + loom::dtype_name(view.dtype) +
                     ", but scale_norm runs on f32 only; use another norm impl for this dtype");
    if (view.device.type != loom::DeviceType::kCpu)
      loom::fail(loom::Code::kUnimplemented,
                 std::string(what) + " is not on the CPU, the only device scale_norm runs on");
    std::vector<int64_t> any(static_cast<size_t>(view.ndim < 1 ? 1 : view.ndim), -1);
    loom::nn::expect(view, any, loom::DType::kF32, what);  // present, contiguous, (..., C)
  }

  double scale_;
};

class Hello final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<ScaleNorm>("scale_norm");  // description and schema come from the manifest
  }
};

}  // namespace

LOOM_PLUGIN(Hello)
