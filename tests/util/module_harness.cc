#include "tests/util/module_harness.h"

#include <filesystem>
#include <stdexcept>

#include "core/plugin/catalog.h"
#include "loom/cpp/tensor.h"

namespace fs = std::filesystem;

namespace loom::testing {

ModuleHarness::ModuleHarness(std::vector<std::string> plugin_dirs, uint64_t seed) : seed_(seed) {
  std::vector<core::SearchRoot> roots;
  for (const std::string& dir : plugin_dirs) {
    if (!fs::exists(fs::path(dir) / "plugin.json"))
      throw std::runtime_error("module harness: no plugin.json in runfiles dir " + dir +
                               " (add the plugin target to the test's data)");
    roots.push_back({fs::absolute(dir), "test"});
  }
  plugins_ =
      std::make_unique<core::PluginManager>(core::Catalog(roots), nlohmann::json::object(), seed);
  plugins_->load_all();
}

ModuleHarness::~ModuleHarness() {
  context_.reset();
  params_.reset();
  object_.reset();
}

IModule& ModuleHarness::build(InterfaceInfo kind, const nlohmann::json& node,
                              const nlohmann::json& inherited, IFp8Recipe* fp8) {
  context_.reset();
  params_.reset();
  object_.reset();
  object_ = core::build_component(*plugins_, node, kind, "/test", inherited, fp8);
  // Every module kind derives from IModule right after IObject (single inheritance).
  auto* module = static_cast<IModule*>(object_.get());
  params_ = std::make_unique<core::ParameterSet>(plugins_->host(), *module, kCpu);
  params_->initialize(seed_);
  return *module;
}

core::ForwardContext& ModuleHarness::new_context(bool training, RecomputePolicy policy,
                                                 int64_t step) {
  context_.reset();
  context_ =
      std::make_unique<core::ForwardContext>(plugins_->host(), training, policy, 0, seed_, step,
                                             params_ ? &params_->module_ids() : nullptr);
  return *context_;
}

TensorView ModuleHarness::tensor(DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  size_t bytes = static_cast<size_t>(n) * dtype_size(dtype) + 64;
  buffers_.push_back(std::make_unique<char[]>(bytes));
  std::fill(buffers_.back().get(), buffers_.back().get() + bytes, 0);
  return make_view(buffers_.back().get(), dtype, shape.data(), static_cast<int32_t>(shape.size()));
}

void ModuleHarness::fill_random(TensorView& t, uint64_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(numel(t)));
  core::fill_normal(v.data(), numel(t), scale, seed, 7);
  core::store_floats(v.data(), t);
}

std::vector<float> ModuleHarness::values(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(numel(t)));
  if (is_contiguous(t)) {
    core::load_floats(t, v.data());
    return v;
  }
  // A strided view (attention's q, k, v gradients as views of one tensor): element by
  // element, in row-major order of its shape.
  const size_t bytes = dtype_size(t.dtype);
  for (int64_t i = 0; i < numel(t); ++i) {
    int64_t offset = 0, rest = i;
    for (int32_t d = t.ndim - 1; d >= 0; --d) {
      offset += (rest % t.shape[d]) * t.strides[d];
      rest /= t.shape[d];
    }
    TensorView one{};
    one.data = static_cast<char*>(t.data) + offset * static_cast<int64_t>(bytes);
    one.dtype = t.dtype, one.device = t.device, one.ndim = 1;
    one.shape[0] = 1, one.strides[0] = 1;
    core::load_floats(one, &v[static_cast<size_t>(i)]);
  }
  return v;
}

void ModuleHarness::set_values(TensorView& t, const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != numel(t))
    throw std::runtime_error("set_values: size mismatch");
  core::store_floats(values.data(), t);
}

}  // namespace loom::testing
