// ModuleHarness: builds one component from real plugins (loaded through the core, as
// `loom train` does), with its parameters allocated, bound and initialised, and gives
// forward contexts and test-owned tensors. Module tests (finite differences, recompute
// policies, dot-product vs fused) are written against it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "core/runtime/forward_context.h"
#include "core/runtime/parameters.h"
#include "loom/kinds/module.h"

namespace loom::testing {

class ModuleHarness {
 public:
  /// \param plugin_dirs  runfiles directories, each holding plugin.json and the library
  ///                     (e.g. "kernels/cpu", "plugins/transformer"); all are loaded
  /// \param seed         the run's seed (initialisation and random streams)
  explicit ModuleHarness(std::vector<std::string> plugin_dirs, uint64_t seed = 1234);
  ~ModuleHarness();

  /// Builds `kind` from `node` (with "impl") with `inherited` options, then allocates,
  /// binds and initialises its parameters. Replaces any module built before.
  /// \param fp8  an FP8 recipe handed to the module (IBuildContext::fp8_recipe), or null
  IModule& build(InterfaceInfo kind, const nlohmann::json& node,
                 const nlohmann::json& inherited = nlohmann::json::object(),
                 IFp8Recipe* fp8 = nullptr);
  /// The built object as an IObject (for kinds that are not modules: optimizers, ...).
  IObject& object() { return *object_; }
  /// Parameters of the module built last.
  core::ParameterSet& params() { return *params_; }
  /// A fresh forward context (the previous one is released).
  core::ForwardContext& new_context(bool training = true,
                                    RecomputePolicy policy = RecomputePolicy::kNone,
                                    int64_t step = 1);
  /// Zero-filled test-owned memory of `shape`.
  TensorView tensor(DType dtype, std::vector<int64_t> shape);
  /// Fills a float tensor (f32, bf16, f16) with normal(0, scale) values from `seed`.
  void fill_random(TensorView& t, uint64_t seed, float scale = 1.f);
  /// Reads a float tensor as f32 values (a strided view's in row-major order of its shape).
  std::vector<float> values(const TensorView& t);
  /// Writes f32 values into a float tensor.
  void set_values(TensorView& t, const std::vector<float>& values);
  core::PluginManager& plugins() { return *plugins_; }
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
  std::unique_ptr<core::PluginManager> plugins_;
  ObjectPtr object_;
  std::unique_ptr<core::ParameterSet> params_;
  std::unique_ptr<core::ForwardContext> context_;
  std::vector<std::unique_ptr<char[]>> buffers_;
};

}  // namespace loom::testing
