// Reading the options of the optim plugin's components.
//
// The core validates a spec node against the manifest's schema and fills its defaults
// before a factory runs, but options a component inherits (the schedule's "lr" and
// "train_steps", the optimizer's "device" and "params_dtype") are merged in afterwards and
// are not checked by the schema, so every value is checked again here. A bad value fails
// with kInvalidArgument and a message that names the option and the fix; the core prefixes
// the spec pointer ("spec /optimizer: ...").
#pragma once

#include <loom/sdk.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace loom::optim {

/// Fails with kInvalidArgument: "option 'NAME' PROBLEM".
[[noreturn]] inline void bad_option(const std::string& name, const std::string& problem) {
  fail(Code::kInvalidArgument, "option '" + name + "' " + problem);
}

/// The number `name`, or nullopt when absent (null counts as absent).
inline std::optional<double> optional_number(const nlohmann::json& options, const char* name) {
  if (!options.contains(name) || options[name].is_null()) return std::nullopt;
  const nlohmann::json& v = options[name];
  if (!v.is_number()) bad_option(name, "must be a number, got " + v.dump());
  double x = v.get<double>();
  if (!std::isfinite(x)) bad_option(name, "must be finite, got " + v.dump());
  return x;
}

/// The number `name`; absent is an error naming `missing_fix`.
inline double number(const nlohmann::json& options, const char* name,
                     const std::string& missing_fix = "set it in the spec") {
  std::optional<double> x = optional_number(options, name);
  if (!x) bad_option(name, "is missing: " + missing_fix);
  return *x;
}

/// The integer `name`, or nullopt when absent.
inline std::optional<int64_t> optional_integer(const nlohmann::json& options, const char* name) {
  if (!options.contains(name) || options[name].is_null()) return std::nullopt;
  const nlohmann::json& v = options[name];
  if (!v.is_number_integer()) bad_option(name, "must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

/// The integer `name`; absent is an error.
inline int64_t integer(const nlohmann::json& options, const char* name) {
  std::optional<int64_t> x = optional_integer(options, name);
  if (!x) bad_option(name, "is missing: set it in the spec");
  return *x;
}

/// The boolean `name`; absent is an error.
inline bool boolean(const nlohmann::json& options, const char* name) {
  if (!options.contains(name) || !options[name].is_boolean())
    bad_option(name, options.contains(name) ? "must be true or false, got " + options[name].dump()
                                            : "is missing: set it to true or false");
  return options[name].get<bool>();
}

/// The string `name`, or `fallback` when absent.
inline std::string string_or(const nlohmann::json& options, const char* name,
                             const std::string& fallback) {
  if (!options.contains(name) || options[name].is_null()) return fallback;
  if (!options[name].is_string()) bad_option(name, "must be a string, got " + options[name].dump());
  return options[name].get<std::string>();
}

/// Checks lo <= x (and x < hi when `hi` is given), naming the option and a typical value.
inline void check_range(const char* name, double x, double lo, std::optional<double> hi_exclusive,
                        const char* typical) {
  bool ok = x >= lo && (!hi_exclusive || x < *hi_exclusive);
  if (ok) return;
  auto text = [](double v) { return nlohmann::json(v).dump(); };
  std::string range =
      hi_exclusive ? "in [" + text(lo) + ", " + text(*hi_exclusive) + ")" : ">= " + text(lo);
  bad_option(name, "must be " + range + ", got " + text(x) + ": use e.g. " + typical);
}

/// The options' "lr" and "weight_decay" as IOptimizer::hyper reports them.
inline OptimizerHyper hyper_of(const nlohmann::json& options) {
  OptimizerHyper h{};
  h.struct_size = sizeof(OptimizerHyper);
  h.lr = number(options, "lr");
  h.weight_decay = optional_number(options, "weight_decay").value_or(0.0);
  return h;
}

/// IOptimizer::hyper's body: `hyper` into the caller's struct.
inline Status fill_hyper(const OptimizerHyper& hyper, OptimizerHyper* out) noexcept {
  if (out == nullptr) return make_status(Code::kInvalidArgument, "hyper: null output");
  copy_struct(hyper, out);
  return ok_status();
}

}  // namespace loom::optim
