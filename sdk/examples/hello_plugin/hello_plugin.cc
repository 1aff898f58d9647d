// hello: the example loom plugin, built out of tree against the installed SDK only
// (README.md says how, with CMake or Bazel).
//
// It provides one component, the norm `scale_norm`: y = x * scale, elementwise, on
// contiguous f32 (..., C) tensors on the CPU. It has no parameters, so its backward is just
// grad_x = grad_y * scale and it saves nothing for backward. Its option schema is in
// manifest.json, which the build embeds into the library and copies beside it as
// plugin.json; the registration below reads the description and schema from there.
#include <loom/sdk.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace {

std::string to_string(loom::StringView view) {
  return view.size == 0 ? std::string() : std::string(view.data, view.size);
}

// Refuses anything but a contiguous f32 CPU tensor of rank >= 1.
// \param where  spec pointer of the module, for the message
// \param what   which tensor, e.g. "forward input 0"
void check_f32_cpu_contiguous(const loom::TensorView& view, const std::string& where,
                              const char* what) {
  if (view.data == nullptr && loom::numel(view) != 0)
    loom::fail(loom::Code::kInvalidArgument, where + ": scale_norm " + what + " has no data");
  if (view.dtype != loom::DType::kF32)
    loom::fail(loom::Code::kUnimplemented,
               where + ": scale_norm " + what + " is " + loom::dtype_name(view.dtype) +
                   ", but only f32 is supported; use another norm impl for this dtype");
  if (view.device.type != loom::DeviceType::kCpu)
    loom::fail(loom::Code::kUnimplemented,
               where + ": scale_norm " + what + " is not on the CPU, the only device it runs on");
  if (view.ndim < 1 || !loom::is_contiguous(view))
    loom::fail(loom::Code::kInvalidArgument,
               where + ": scale_norm " + what + " must be a contiguous (..., C) tensor, got " +
                   (view.ndim < 1 ? "a scalar" : "a strided view; make it contiguous first"));
}

// out = in * scale; both (N,) contiguous f32.
void scale_f32(const float* in, float scale, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale;
}

class ScaleNorm final : public loom::Object<loom::INorm> {
 public:
  // `options` is the spec node, validated against the manifest's schema with defaults
  // filled in: {"impl": "scale_norm", "scale": 1.0}.
  ScaleNorm(const nlohmann::json& options, loom::IBuildContext& ctx)
      : where_(to_string(ctx.spec_pointer())), scale_(options.value("scale", 1.0)) {
    if (!(scale_ > 0.0))  // the schema says so too; a direct caller may skip validation
      loom::fail(loom::Code::kInvalidArgument,
                 where_ + "/scale: expected number > 0, got " + std::to_string(scale_));
  }

  // No parameters and no children.
  int32_t param_count() const noexcept override { return 0; }
  loom::Status param_info(int32_t index, loom::ParamInfo* out) const noexcept override {
    return no_such("parameter", index);
  }
  loom::Status bind_param(int32_t index, const loom::TensorView* param,
                          const loom::TensorView* grad) noexcept override {
    return no_such("parameter", index);
  }
  loom::Status init_param(int32_t index, uint64_t seed) noexcept override {
    return no_such("parameter", index);
  }
  int32_t child_count() const noexcept override { return 0; }
  loom::Status child(int32_t index, loom::StringView* name, loom::IModule** out) noexcept override {
    return no_such("child", index);
  }

  // inputs[0] x (..., C) f32 -> outputs[0] y (..., C) f32, y = x * scale.
  loom::Status forward(loom::IForwardContext* ctx, const loom::TensorView* inputs,
                       int32_t num_inputs, loom::TensorView* outputs,
                       int32_t num_outputs) noexcept override {
    return loom::guard([&] {
      expect_counts("forward", num_inputs, num_outputs);
      const loom::TensorView& x = inputs[0];  // (..., C)
      check_f32_cpu_contiguous(x, where_, "forward input 0");
      loom::TensorView& y = outputs[0];  // (..., C)
      loom::throw_if_error(ctx->allocate(loom::DType::kF32, x.ndim, x.shape, x.device, &y),
                           where_ + ": scale_norm forward output");
      scale_f32(static_cast<const float*>(x.data), static_cast<float>(scale_), loom::numel(x),
                static_cast<float*>(y.data));
    });
  }

  // grad_outputs[0] dy (..., C) -> grad_inputs[0] dx (..., C), dx = dy * scale.
  loom::Status backward(loom::IForwardContext* ctx, const loom::TensorView* grad_outputs,
                        int32_t num_grad_outputs, loom::TensorView* grad_inputs,
                        int32_t num_grad_inputs) noexcept override {
    return loom::guard([&] {
      expect_counts("backward", num_grad_outputs, num_grad_inputs);
      const loom::TensorView& dy = grad_outputs[0];  // (..., C)
      check_f32_cpu_contiguous(dy, where_, "backward grad output 0");
      loom::TensorView& dx = grad_inputs[0];  // (..., C)
      loom::throw_if_error(ctx->allocate(loom::DType::kF32, dy.ndim, dy.shape, dy.device, &dx),
                           where_ + ": scale_norm backward grad input");
      scale_f32(static_cast<const float*>(dy.data), static_cast<float>(scale_), loom::numel(dy),
                static_cast<float*>(dx.data));
    });
  }

 private:
  loom::Status no_such(const char* what, int32_t index) const noexcept {
    return loom::guard([&] {
      loom::fail(loom::Code::kOutOfRange, where_ + ": scale_norm has no " + what + " " +
                                              std::to_string(index) + " (it has none)");
    });
  }

  void expect_counts(const char* pass, int32_t num_in, int32_t num_out) const {
    if (num_in < 1 || num_out < 1)
      loom::fail(loom::Code::kInvalidArgument,
                 where_ + ": scale_norm " + pass + " takes 1 tensor in and 1 out, got " +
                     std::to_string(num_in) + " in and " + std::to_string(num_out) + " out");
  }

  std::string where_;  // spec pointer of this node, e.g. "/model/layer/norm"
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
