// Kernel libraries of a run: the spec's /kernels section (which libraries to load, which
// kernel must serve an op), loaded the same way for training and for generation.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/plugin/plugin_manager.h"

namespace loom::core {

/// The spec's /kernels section.
struct KernelsConfig {
  std::vector<std::string> libraries;      ///< empty: kernels_<device>
  std::map<std::string, std::string> pin;  ///< op -> kernel name that must serve it
  /// Reads a /kernels node ({"libraries": [...], "pin": {op: kernel}}; either may be
  /// absent, as in a checkpoint of an older run). Throws SpecError for another shape.
  static KernelsConfig from_json(const nlohmann::json& kernels);
};

/// Loads `config`'s libraries (default: kernels_<device family>), checks that `device` can
/// hold tensors in this process and sets the pins. Libraries already loaded are kept.
/// Throws PluginError (kNotFound) for a missing library and Error naming `what` and the
/// device for an unusable device.
/// \param what  what the kernels are for, e.g. "spec /train/device" or "generation on"
void load_kernel_libraries(PluginManager& plugins, const KernelsConfig& config, Device device,
                           const std::string& what);

/// "cpu" or "cuda": the spec's name of a device family.
const char* device_family_name(DeviceType type);

}  // namespace loom::core
