// Reading a factory's options in a module plugin: the node's own keys (validated and
// defaulted by the core against the manifest's schema) and the keys handed down by the
// enclosing component through IBuildContext::build_child_with (hidden size, heads, dtype,
// device, ...).
//
// Where a message says where: a factory's error that starts with "/key: ..." is reported by
// the core at the node's spec pointer plus "/key" (spec /model/layer/key: ...); one that
// starts with "#/a/b: ..." at the absolute pointer /a/b (spec /a/b: ...), for a rule that
// involves another section (e.g. "#/train/seq_length: ..."). Any other text is reported at
// the node itself. `invalid` below throws such a message; `nn::build_child` (child.h) passes
// a child's message on as an absolute one, so it is not prefixed twice.
#pragma once

#include <loom/cpp/error.h>
#include <loom/types.h>

#include <nlohmann/json.hpp>
#include <string>

namespace loom::nn {

/// Throws kInvalidArgument with `message`, which should start with "/key: " (relative to the
/// node being built) or "#/a/b: " (an absolute spec pointer); see above.
[[noreturn]] inline void invalid(const std::string& message) {
  fail(Code::kInvalidArgument, message);
}

/// An option the enclosing component hands down; throws naming `who` when it is absent
/// (a module built on its own must be given it explicitly).
/// \param options  the merged options handed to the factory
/// \param key      the option's name
/// \param who      the module, for the message ("transformer layer")
template <class T>
T inherited(const nlohmann::json& options, const char* key, const char* who) {
  auto it = options.find(key);
  if (it == options.end() || it->is_null())
    invalid(std::string("/") + key + ": missing; the " + who +
            " takes it from its enclosing component (build it with build_child_with, or set "
            "it when building the " +
            who + " on its own)");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    invalid(std::string("/") + key + ": has the wrong type (" + it->dump() + ")");
  }
}

/// The same, with `fallback` when the option is absent or null.
template <class T>
T inherited_or(const nlohmann::json& options, const char* key, T fallback) {
  auto it = options.find(key);
  if (it == options.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    invalid(std::string("/") + key + ": has the wrong type (" + it->dump() + ")");
  }
}

/// The "params_dtype" option ("f32", "bf16" or "f16"; f32 when absent), which the core hands
/// the root model from spec /precision/params.
inline DType params_dtype(const nlohmann::json& options) {
  std::string name = inherited_or<std::string>(options, "params_dtype", "f32");
  DType dtype = dtype_from_name(name.c_str());
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    invalid("/params_dtype: '" + name + "' is not a parameter dtype; use f32, bf16 or f16");
  return dtype;
}

/// The "device" option ("cpu" or "cuda"; cpu when absent), which the core hands the root
/// model from spec /train/device. A CUDA module runs on the calling thread's current device.
inline Device device_of(const nlohmann::json& options) {
  std::string name = inherited_or<std::string>(options, "device", "cpu");
  if (name == "cpu") return Device{DeviceType::kCpu, 0};
  if (name == "cuda") return Device{DeviceType::kCuda, 0};
  invalid("/device: '" + name + "' is not a device; use cpu or cuda");
}

/// The spec's name of a device family ("cpu", "cuda"), to hand down.
inline std::string device_name(Device device) {
  return device.type == DeviceType::kCuda ? "cuda" : "cpu";
}

}  // namespace loom::nn
