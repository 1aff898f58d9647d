// testlegacyoptim: "legacy_optimizer" is the optimizer `inner` (built as its child, with what
// the core hands down) behind an object that reports optimizer 1.0, as a plugin built against
// the SDK before update_many does. Its update_many must never be called: an older plugin's
// object has no such entry, so a call here aborts the process.
#include <loom/sdk.h>

#include <cstdio>
#include <cstdlib>

namespace {

using loom::Status;

class LegacyOptimizer final : public loom::Object<loom::IOptimizer> {
 public:
  LegacyOptimizer(const nlohmann::json&, loom::IBuildContext& ctx) {
    loom::IObject* child = nullptr;
    loom::throw_if_error(ctx.build_child_with(loom::make_string_view("inner"),
                                              loom::kinds::kOptimizer, ctx.inherited(), &child),
                         "building the inner optimizer");
    inner_ = loom::interface_cast<loom::IOptimizer>(child);
    LOOM_CHECK(inner_ != nullptr, "the inner component is not an optimizer");
  }
  ~LegacyOptimizer() override { inner_->destroy(); }

  loom::InterfaceInfo interface_info() const noexcept override {
    return loom::InterfaceInfo{loom::kinds::kOptimizer.kind, 1, 0};
  }
  int32_t state_count() const noexcept override { return inner_->state_count(); }
  const char* state_name(int32_t index) const noexcept override {
    return inner_->state_name(index);
  }
  Status update(const loom::OptimizerStep* hp, bool decay, loom::TensorView* master,
                const loom::TensorView* grad, loom::TensorView* states,
                void* stream) noexcept override {
    return inner_->update(hp, decay, master, grad, states, stream);
  }
  Status update_many(const loom::OptimizerStep*, int32_t, const loom::OptimizerShard*,
                     void*) noexcept override {
    std::fprintf(stderr, "testlegacyoptim: update_many called on an optimizer 1.0 object\n");
    std::abort();
  }
  Status hyper(loom::OptimizerHyper*) const noexcept override {
    std::fprintf(stderr, "testlegacyoptim: hyper called on an optimizer 1.0 object\n");
    std::abort();
  }

 private:
  loom::IOptimizer* inner_ = nullptr;
};

class LegacyOptim final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<LegacyOptimizer>("legacy_optimizer");
  }
};

}  // namespace

LOOM_PLUGIN(LegacyOptim)
