// testlegacymodules: what a plugin built against SDK 1.4 looks like to this core. Its entry
// says ABI minor LOOM_ABI_MINOR - 1; its components are model 1.0 and norm 1.0 objects that
// forward the 1.0 methods to a current component built as their child "inner". A 1.0 object
// has no backward_weight, step_end, info or cost in its table: calling one here aborts.
#include <loom/sdk.h>

#include <cstdio>
#include <cstdlib>

namespace {

using loom::Status;

[[noreturn]] void absent(const char* method) {
  std::fprintf(stderr, "testlegacymodules: %s called on an interface 1.0 object\n", method);
  std::abort();
}

// The IModule 1.0 methods of `I`, forwarded to `inner`.
template <class I>
class Legacy : public loom::Object<I> {
 public:
  Legacy(loom::IBuildContext& ctx, loom::InterfaceInfo kind) : kind_(kind) {
    loom::IObject* child = nullptr;
    loom::throw_if_error(
        ctx.build_child_with(loom::make_string_view("inner"), kind, ctx.inherited(), &child),
        "building the inner component");
    inner_ = loom::interface_cast<I>(child);
    LOOM_CHECK(inner_ != nullptr, "the inner component is not a ", kind.kind);
  }
  ~Legacy() override { inner_->destroy(); }
  loom::InterfaceInfo interface_info() const noexcept override {
    return loom::InterfaceInfo{kind_.kind, 1, 0};
  }
  int32_t param_count() const noexcept override { return inner_->param_count(); }
  Status param_info(int32_t i, loom::ParamInfo* out) const noexcept override {
    return inner_->param_info(i, out);
  }
  Status bind_param(int32_t i, const loom::TensorView* p,
                    const loom::TensorView* g) noexcept override {
    return inner_->bind_param(i, p, g);
  }
  Status init_param(int32_t i, uint64_t seed) noexcept override {
    return inner_->init_param(i, seed);
  }
  int32_t child_count() const noexcept override { return inner_->child_count(); }
  Status child(int32_t i, loom::StringView* name, loom::IModule** out) noexcept override {
    return inner_->child(i, name, out);
  }
  Status forward(loom::IForwardContext* ctx, const loom::TensorView* in, int32_t n_in,
                 loom::TensorView* out, int32_t n_out) noexcept override {
    return inner_->forward(ctx, in, n_in, out, n_out);
  }
  Status backward(loom::IForwardContext* ctx, const loom::TensorView* g_out, int32_t n_g_out,
                  loom::TensorView* g_in, int32_t n_g_in) noexcept override {
    return inner_->backward(ctx, g_out, n_g_out, g_in, n_g_in);
  }
  Status backward_weight(loom::IForwardContext*) noexcept override { absent("backward_weight"); }
  Status step_end(const loom::StepEvent*) noexcept override { absent("step_end"); }

 protected:
  I* inner_ = nullptr;

 private:
  loom::InterfaceInfo kind_;
};

class LegacyModel final : public Legacy<loom::IModel> {
 public:
  static constexpr loom::InterfaceInfo kInterface{"model", 1, 0};
  LegacyModel(const nlohmann::json&, loom::IBuildContext& ctx) : Legacy(ctx, loom::kinds::kModel) {}
  Status info(loom::ModelInfo*) const noexcept override { absent("info"); }
  Status cost(const loom::CostQuery*, loom::ModelCost*) const noexcept override { absent("cost"); }
};

class LegacyNorm final : public Legacy<loom::INorm> {
 public:
  static constexpr loom::InterfaceInfo kInterface{"norm", 1, 0};
  LegacyNorm(const nlohmann::json&, loom::IBuildContext& ctx) : Legacy(ctx, loom::kinds::kNorm) {}
};

class LegacyModules final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<LegacyModel>("legacy_model");
    r.factory<LegacyNorm>("legacy_norm");
  }
};

}  // namespace

// The entry of a plugin built against the previous minor: the same as LOOM_PLUGIN's, but
// for the ABI minor it reports.
extern "C" LOOM_EXPORT const loom::PluginInfo* loom_plugin_v1() {
  static const loom::PluginInfo info = [] {
    loom::PluginInfo i = *loom::plugin_info<LegacyModules>();
    i.abi_minor = LOOM_ABI_MINOR - 1;
    return i;
  }();
  return &info;
}
