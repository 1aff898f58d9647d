// Reading a factory's options: the node's own keys (validated and defaulted by the core
// against the manifest's schema) and the keys handed down by the enclosing component
// through IBuildContext::build_child_with (hidden size, heads, dtype, device, ...).
//
// Messages follow the core's convention: "/key: ..." is reported at the node's spec pointer
// plus "/key", "#/a/b: ..." at the absolute pointer /a/b.
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>

namespace loom::transformer {

/// Throws kInvalidArgument with `message` (which should start with "/key: ").
[[noreturn]] void invalid(const std::string& message);

/// An option the enclosing component hands down; throws naming `who` when it is absent
/// (a module built on its own must be given it explicitly).
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

/// The same, with a fallback when absent.
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

/// "params_dtype" ("f32", "bf16", "f16"; f32 when absent).
DType params_dtype(const nlohmann::json& options);
/// "device" ("cpu", "cuda"; cpu when absent).
Device device_of(const nlohmann::json& options);
/// The spec names of a dtype and device, to hand down.
std::string device_name(Device device);

}  // namespace loom::transformer
