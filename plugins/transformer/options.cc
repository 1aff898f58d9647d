#include "plugins/transformer/options.h"

namespace loom::transformer {

void invalid(const std::string& message) { fail(Code::kInvalidArgument, message); }

DType params_dtype(const nlohmann::json& options) {
  std::string name = inherited_or<std::string>(options, "params_dtype", "f32");
  DType dtype = dtype_from_name(name.c_str());
  if (dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) return dtype;
  invalid("/params_dtype: '" + name + "' is not a parameter dtype; use f32, bf16 or f16");
}

Device device_of(const nlohmann::json& options) {
  std::string name = inherited_or<std::string>(options, "device", "cpu");
  if (name == "cpu") return Device{DeviceType::kCpu, 0};
  if (name == "cuda") return Device{DeviceType::kCuda, 0};
  invalid("/device: '" + name + "' is not a device; use cpu or cuda");
}

std::string device_name(Device device) { return device.type == DeviceType::kCuda ? "cuda" : "cpu"; }

}  // namespace loom::transformer
