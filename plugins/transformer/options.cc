#include "plugins/transformer/options.h"

namespace loom::transformer {

void invalid(const std::string& message) { fail(Code::kInvalidArgument, message); }

DType params_dtype(const nlohmann::json& options) {
  std::string name = inherited_or<std::string>(options, "params_dtype", "f32");
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
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
