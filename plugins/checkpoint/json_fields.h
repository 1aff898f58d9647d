// Reading optional fields of JSON objects (spec nodes, config.json) with defaults.
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>

namespace loom::checkpoint {

/// parent[key] when it is an object, else an empty object.
inline const nlohmann::json& child(const nlohmann::json& parent, const char* key) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return parent.is_object() && parent.contains(key) && parent[key].is_object() ? parent[key]
                                                                               : kEmpty;
}

/// j[key] as T, or `fallback` when absent or null; a value of another type is
/// Error(kInvalidArgument) "WHERE KEY: unexpected value ...".
template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    fail(Code::kInvalidArgument, where + key + ": unexpected value " + j[key].dump());
  }
}

}  // namespace loom::checkpoint
