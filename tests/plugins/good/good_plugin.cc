// A well-behaved test plugin: a model with a child norm, a norm and an LR schedule, and a
// kernel, all registered through the SDK's C++ conveniences (loom/sdk.h).
#include <loom/sdk.h>

#include <cmath>
#include <string>

#include "tests/plugins/common/test_module.h"

namespace {

using loom::Status;

using loom::testing::TestModule;

class TestScale final : public TestModule<loom::INorm> {
 public:
  TestScale(const nlohmann::json& options, loom::IBuildContext&)
      : scale_(options.at("scale").get<double>()) {}
  double scale_;
};

class TestModel final : public TestModule<loom::IModel> {
 public:
  TestModel(const nlohmann::json& options, loom::IBuildContext& ctx)
      : vocab_(options.at("vocab_size").get<int64_t>()),
        hidden_(options.at("hidden_size").get<int64_t>()) {
    loom::IObject* child = nullptr;
    loom::throw_if_error(
        ctx.build_child(loom::make_string_view("norm"), loom::kinds::kNorm, &child),
        "building the norm");
    norm_ = loom::interface_cast<loom::INorm>(child);
    LOOM_CHECK(norm_ != nullptr, "child is not a norm");
  }
  ~TestModel() override { norm_->destroy(); }
  int32_t param_count() const noexcept override { return 1; }
  Status param_info(int32_t index, loom::ParamInfo* out) const noexcept override {
    return loom::guard([&] {
      LOOM_CHECK(index == 0, "index=", index);
      *out = loom::ParamInfo{};
      out->struct_size = sizeof(loom::ParamInfo);
      out->name = "embedding";
      out->dtype = loom::DType::kF32;
      out->ndim = 2;
      out->shape[0] = out->global_shape[0] = vocab_;
      out->shape[1] = out->global_shape[1] = hidden_;
      out->tp_split_dim = -1;
      out->expert_index = -1;
      out->init = loom::ParamInit::kNormal;
      out->init_std = 0.02f;
    });
  }
  Status info(loom::ModelInfo* out) const noexcept override {
    loom::ModelInfo m{};
    m.struct_size = sizeof(loom::ModelInfo);
    m.vocab_size = vocab_;
    m.pp_size = m.chunks = 1;
    m.first_stage = m.last_stage = 1;
    loom::copy_struct(m, out);
    return loom::ok_status();
  }
  Status cost(const loom::CostQuery*, loom::ModelCost* out) const noexcept override {
    loom::ModelCost c{sizeof(loom::ModelCost), 0, -1};  // unknown: the core counts 6N
    loom::copy_struct(c, out);
    return loom::ok_status();
  }
  int32_t child_count() const noexcept override { return 1; }
  Status child(int32_t index, loom::StringView* name, loom::IModule** out) noexcept override {
    if (index != 0) return loom::make_status(loom::Code::kOutOfRange, "one child");
    *name = loom::make_string_view("norm");
    *out = norm_;
    return loom::ok_status();
  }

 private:
  int64_t vocab_, hidden_;
  loom::INorm* norm_ = nullptr;
};

class TestWarmup final : public loom::Object<loom::ILrSchedule> {
 public:
  TestWarmup(const nlohmann::json& options, loom::IBuildContext&)
      : lr_(options.at("lr").get<double>()), warmup_(options.at("warmup_steps").get<int64_t>()) {}
  double lr(int64_t step) const noexcept override {
    return step < warmup_ ? lr_ * static_cast<double>(step) / static_cast<double>(warmup_) : lr_;
  }

 private:
  double lr_;
  int64_t warmup_;
};

// y = a * x + y over f32 vectors.
Status axpy(const loom::OpCall* call) {
  return loom::guard([&] {
    LOOM_CHECK(call->num_inputs == 1 && call->num_outputs == 1, "axpy takes x and y");
    float a = *static_cast<const float*>(call->attrs);
    const float* x = static_cast<const float*>(call->inputs[0].data);
    float* y = static_cast<float*>(call->outputs[0].data);
    for (int64_t i = 0; i < loom::numel(call->inputs[0]); ++i) y[i] += a * x[i];
  });
}

class TestGood final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<TestWarmup>("test_warmup");
    r.factory<TestScale>("test_scale");
    r.factory<TestModel>("test_model");
    loom::KernelDesc k{};
    k.op = "test_axpy";
    k.op_version = 1;
    k.device = loom::DeviceType::kCpu;
    k.dtype = loom::DType::kF32;
    k.name = "testgood.axpy";
    k.priority = 10;
    k.fn = &axpy;
    r.kernel(k);
  }
};

}  // namespace

LOOM_PLUGIN(TestGood)
