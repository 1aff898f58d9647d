// A small command-line parser for the `loom` subcommands: positionals, boolean flags and
// repeatable valued options (`--set a.b=1 --set c=2`). Unknown options are refused with a
// did-you-mean.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::cli {

/// What a subcommand accepts.
struct ArgSpec {
  std::vector<std::string> flags;   ///< boolean options, e.g. "--json"
  std::vector<std::string> values;  ///< options with a value, e.g. "--set" (repeatable)
  int min_positionals = 0;
  int max_positionals = 0;
  std::string usage;  ///< "loom spec validate SPEC [--set PATH=VALUE]..."
};

/// Parsed arguments.
struct Args {
  std::vector<std::string> positionals;
  std::map<std::string, std::vector<std::string>> values;
  std::map<std::string, bool> flags;

  bool flag(const std::string& name) const;
  /// All values of a repeatable option, in order.
  std::vector<std::string> all(const std::string& name) const;
  /// The last value of an option, or `fallback`.
  std::string get(const std::string& name, const std::string& fallback = {}) const;
  /// The last value of an option as an integer in [min, max], or `fallback` when absent.
  /// Throws core::UsageError naming the option, the range and the usage line otherwise.
  int64_t integer(const std::string& name, int64_t fallback, int64_t min = 0,
                  int64_t max = INT64_MAX) const;

  std::string usage;  ///< the subcommand's usage line (for messages)
};

/// Parses `argv` against `spec`. Throws core::UsageError naming the bad argument and the
/// usage line. Accepts "--opt=value" and "--opt value".
Args parse_args(const std::vector<std::string>& argv, const ArgSpec& spec);

}  // namespace loom::cli
