// Registers a component that testgood registers too: loading both must fail cleanly.
#include <loom/sdk.h>

namespace {

class DupScale final : public loom::Object<loom::INorm> {
 public:
  DupScale(const nlohmann::json&, loom::IBuildContext&) {}
  int32_t param_count() const noexcept override { return 0; }
  loom::Status param_info(int32_t, loom::ParamInfo*) const noexcept override {
    return loom::make_status(loom::Code::kOutOfRange, "none");
  }
  loom::Status bind_param(int32_t, const loom::TensorView*, const loom::TensorView*) noexcept override {
    return loom::make_status(loom::Code::kOutOfRange, "none");
  }
  loom::Status init_param(int32_t, uint64_t) noexcept override { return loom::ok_status(); }
  int32_t child_count() const noexcept override { return 0; }
  loom::Status child(int32_t, loom::StringView*, loom::IModule**) noexcept override {
    return loom::make_status(loom::Code::kOutOfRange, "none");
  }
  loom::Status forward(loom::IForwardContext*, const loom::TensorView*, int32_t, loom::TensorView*,
                       int32_t) noexcept override {
    return loom::make_status(loom::Code::kUnimplemented, "test");
  }
  loom::Status backward(loom::IForwardContext*, const loom::TensorView*, int32_t,
                        loom::TensorView*, int32_t) noexcept override {
    return loom::make_status(loom::Code::kUnimplemented, "test");
  }
};

class TestDup final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override { r.factory<DupScale>("test_scale"); }
};

}  // namespace

LOOM_PLUGIN(TestDup)
