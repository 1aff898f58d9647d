// Test environment of the optim plugin: the real plugin (and, for the optimizers, the CPU
// kernel library) loaded through the core from the test's runfiles, and components built
// the way the core builds them: the spec node resolved against the manifest's schema
// (defaults filled in), then built with the options the core hands down.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"

namespace loom::testing {

class OptimEnv {
 public:
  /// Loads "optim", and "kernels_cpu" when `with_kernels`.
  explicit OptimEnv(bool with_kernels) {
    std::vector<core::SearchRoot> roots{{std::filesystem::absolute("plugins/optim"), "test"}};
    if (with_kernels) roots.push_back({std::filesystem::absolute("kernels/cpu"), "test"});
    plugins_ = std::make_unique<core::PluginManager>(core::Catalog(roots));
    plugins_->load("optim");
    if (with_kernels) plugins_->load("kernels_cpu");
  }

  /// Resolves `node` as the spec's `slot` ("optimizer" or "lr_schedule") and builds it with
  /// `inherited`. Throws what the core throws (SpecError for a bad option).
  ObjectPtr build(const std::string& slot, const nlohmann::json& node,
                  const nlohmann::json& inherited = nlohmann::json::object()) {
    nlohmann::json spec = {{slot, node}};
    core::resolve_spec(spec, plugins_->catalog(), &plugins_->registry());
    return build_unchecked(slot, spec[slot], inherited);
  }

  /// Builds `node` as given, without the schema (no defaults, no bounds): what the plugin
  /// itself checks.
  ObjectPtr build_unchecked(const std::string& slot, const nlohmann::json& node,
                            const nlohmann::json& inherited = nlohmann::json::object()) {
    const InterfaceInfo& kind = slot == "optimizer" ? kinds::kOptimizer : kinds::kLrSchedule;
    return core::build_component(*plugins_, node, kind, "/" + slot, inherited);
  }

  core::PluginManager& plugins() { return *plugins_; }

 private:
  std::unique_ptr<core::PluginManager> plugins_;
};

/// The message of the loom::Error that `body` throws, with its code; "" when none.
template <class Body>
std::string error_of(Body&& body, Code* code = nullptr) {
  try {
    body();
  } catch (const Error& e) {
    if (code != nullptr) *code = e.code();
    return e.what();
  }
  return "";
}

}  // namespace loom::testing
