// Reading optional fields of JSON objects (spec nodes, config.json) with defaults.
#pragma once

#include <loom/sdk.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::checkpoint {

/// parent[key] when it is an object, else an empty object.
inline const nlohmann::json& child(const nlohmann::json& parent, const char* key) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return parent.is_object() && parent.contains(key) && parent[key].is_object() ? parent[key]
                                                                               : kEmpty;
}

/// j[key] as T, or `fallback` when absent or null; a value of another type is
/// Error(kInvalidArgument) "WHERE KEY: unexpected value ...".
/// Integers (and arrays of them) go through JsonIn's checks: nlohmann converts a float such
/// as 2.8e65 to an integer type with a plain cast, undefined behaviour beyond the type's
/// range (found by the checkpoint fuzzer in a config.json field).
template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  try {
    if constexpr (std::is_same_v<T, int64_t>) {
      return JsonIn(j, where)[key].int64();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      return JsonIn(j, where)[key].int64_array();
    } else {
      static_assert(!std::is_integral_v<T> || std::is_same_v<T, bool>,
                    "read other integer types as int64_t and check their range");
      return j[key].get<T>();
    }
  } catch (const std::exception&) {
    fail(Code::kInvalidArgument, where + key + ": unexpected value " + j[key].dump());
  }
}

/// Fields of a config.json (or a node of it) with messages "WHERE KEY ...".
struct ConfigReader {
  const nlohmann::json& config;
  std::string where;  // "DIR/config.json: "

  /// An integer >= `least` (kInvalidArgument otherwise), `fallback` when absent or null.
  int64_t integer(const char* key, int64_t fallback, int64_t least = 1) const {
    auto v = get_or<int64_t>(config, key, fallback, where);
    if (v < least)
      fail(Code::kInvalidArgument,
           where + key + " must be >= " + std::to_string(least) + ", got " + std::to_string(v));
    // Sizes are multiplied into tensor shapes: bound them before any product overflows.
    if (v > kMaxJsonSize)
      fail(Code::kInvalidArgument,
           where + key + " = " + std::to_string(v) + " is beyond any model (more than 2^40)");
    return v;
  }
  double number(const char* key, double fallback) const {
    auto v = get_or<double>(config, key, fallback, where);
    if (!std::isfinite(v) || v <= 0)
      fail(Code::kInvalidArgument, where + key + " must be a positive number");
    return v;
  }
  /// kUnimplemented "WHERE KEY = VALUE: WHY".
  [[noreturn]] void refuse(const char* key, const std::string& why) const {
    fail(Code::kUnimplemented, where + key + " = " + config[key].dump() + ": " + why);
  }
};

}  // namespace loom::checkpoint
