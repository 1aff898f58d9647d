#include "core/plugin/kernel_libraries.h"

#include <fmt/format.h>

#include "core/util/errors.h"

namespace loom::core {

const char* device_family_name(DeviceType type) {
  return type == DeviceType::kCuda ? "cuda" : "cpu";
}

KernelsConfig KernelsConfig::from_json(const nlohmann::json& kernels) {
  if (!kernels.is_object())
    throw SpecError("/kernels", "expected an object {\"libraries\": [...], \"pin\": {...}}");
  KernelsConfig c;
  if (kernels.contains("libraries"))
    for (const auto& l : kernels["libraries"]) c.libraries.push_back(l.get<std::string>());
  if (kernels.contains("pin"))
    for (const auto& [op, kernel] : kernels["pin"].items()) c.pin[op] = kernel.get<std::string>();
  return c;
}

void load_kernel_libraries(PluginManager& plugins, const KernelsConfig& config, Device device,
                           const std::string& what) {
  const std::string family = device_family_name(device.type);
  std::vector<std::string> libraries = config.libraries;
  if (libraries.empty()) libraries.push_back("kernels_" + family);
  for (const std::string& lib : libraries) {
    if (plugins.is_loaded(lib)) continue;
    if (plugins.catalog().find(lib) == nullptr)
      throw PluginError(
          Code::kNotFound,
          fmt::format("kernel library '{}' not found (spec /kernels/libraries, or the "
                      "default for device '{}'); searched: {}; pass --plugin-path",
                      lib, family, describe_roots(plugins.catalog().roots())));
    plugins.load(lib);
  }
  // A device other than the CPU needs a runtime that sees one: said before anything is built.
  try {
    plugins.host().check_device(device);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{} '{}': {}", what, family, e.what()));
  }
  plugins.host().set_pins(config.pin);
}

}  // namespace loom::core
