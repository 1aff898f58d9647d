// testlegacyoptim: "legacy_optimizer" is the optimizer `inner` (built as its child, with what
// the core hands down) behind an object that reports optimizer 1.0, as a plugin built against
// the SDK before update_many does. Its update_many must never be called: an older plugin's
// object has no such entry, so a call here aborts the process.
// "castless_optimizer" is `inner` with update_many but without the cast of each master into
// its bf16/f16 parameter (every shard's param view dropped): the mistake the core must refuse
// by name rather than train a model that never changes.
#include <loom/sdk.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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
  loom::DType state_dtype(int32_t) const noexcept override {
    std::fprintf(stderr, "testlegacyoptim: state_dtype called on an optimizer 1.0 object\n");
    std::abort();
  }

 private:
  loom::IOptimizer* inner_ = nullptr;
};

class CastlessOptimizer final : public loom::Object<loom::IOptimizer> {
 public:
  CastlessOptimizer(const nlohmann::json&, loom::IBuildContext& ctx) {
    loom::IObject* child = nullptr;
    loom::throw_if_error(ctx.build_child_with(loom::make_string_view("inner"),
                                              loom::kinds::kOptimizer, ctx.inherited(), &child),
                         "building the inner optimizer");
    inner_ = loom::interface_cast<loom::IOptimizer>(child);
    LOOM_CHECK(inner_ != nullptr, "the inner component is not an optimizer");
  }
  ~CastlessOptimizer() override { inner_->destroy(); }

  int32_t state_count() const noexcept override { return inner_->state_count(); }
  const char* state_name(int32_t index) const noexcept override {
    return inner_->state_name(index);
  }
  Status update(const loom::OptimizerStep* hp, bool decay, loom::TensorView* master,
                const loom::TensorView* grad, loom::TensorView* states,
                void* stream) noexcept override {
    return inner_->update(hp, decay, master, grad, states, stream);
  }
  Status update_many(const loom::OptimizerStep* hp, int32_t count,
                     const loom::OptimizerShard* shards, void* stream) noexcept override {
    return loom::guard([&] {
      std::vector<loom::OptimizerShard> own;
      const auto* bytes = reinterpret_cast<const char*>(shards);
      for (int32_t i = 0; i < count; ++i) {
        loom::OptimizerShard s{};
        std::memcpy(&s, bytes + static_cast<size_t>(i) * shards[0].struct_size, sizeof(s));
        s.struct_size = sizeof(s);
        s.param = loom::TensorView{};  // the cast this optimizer forgets
        own.push_back(s);
      }
      loom::throw_if_error(inner_->update_many(hp, count, own.data(), stream));
    });
  }
  Status hyper(loom::OptimizerHyper* out) const noexcept override { return inner_->hyper(out); }
  loom::DType state_dtype(int32_t index) const noexcept override {
    return inner_->state_dtype(index);
  }

 private:
  loom::IOptimizer* inner_ = nullptr;
};

class LegacyOptim final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<LegacyOptimizer>("legacy_optimizer");
    r.factory<CastlessOptimizer>("castless_optimizer");
  }
};

}  // namespace

LOOM_PLUGIN(LegacyOptim)
