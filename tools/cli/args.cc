#include "tools/cli/args.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/schema/did_you_mean.h"
#include "core/util/errors.h"

namespace loom::cli {

bool Args::flag(const std::string& name) const {
  auto it = flags.find(name);
  return it != flags.end() && it->second;
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? std::vector<std::string>{} : it->second;
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values.find(name);
  return it == values.end() || it->second.empty() ? fallback : it->second.back();
}

int64_t Args::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
  std::string v = get(name);
  if (v.empty()) return fallback;
  try {
    size_t used = 0;
    int64_t n = std::stoll(v, &used);
    if (used == v.size() && n >= min && n <= max) return n;
  } catch (const std::exception&) {
  }
  std::string range = max == INT64_MAX ? (min == 0 ? std::string("a non-negative integer")
                                                   : fmt::format("an integer >= {}", min))
                                       : fmt::format("an integer from {} to {}", min, max);
  throw core::UsageError(fmt::format("{} expects {}, got '{}' ({})", name, range, v, usage));
}

Args parse_args(const std::vector<std::string>& argv, const ArgSpec& spec) {
  Args args;
  args.usage = spec.usage;
  auto contains = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() > 1 && a[0] == '-' && a != "-") {
      std::string name = a, value;
      bool has_value = false;
      if (size_t eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_value = true;
      }
      if (contains(spec.flags, name)) {
        if (has_value)
          throw core::UsageError(fmt::format("{} takes no value\nusage: {}", name, spec.usage));
        args.flags[name] = true;
      } else if (contains(spec.values, name)) {
        if (!has_value) {
          if (i + 1 >= argv.size())
            throw core::UsageError(fmt::format("{} needs a value\nusage: {}", name, spec.usage));
          value = argv[++i];
        }
        args.values[name].push_back(value);
      } else {
        std::vector<std::string> known = spec.flags;
        known.insert(known.end(), spec.values.begin(), spec.values.end());
        throw core::UsageError(fmt::format("unknown option '{}'{}\nusage: {}", name,
                                           core::did_you_mean(name, known), spec.usage));
      }
      continue;
    }
    args.positionals.push_back(a);
  }
  int n = static_cast<int>(args.positionals.size());
  if (n < spec.min_positionals)
    throw core::UsageError(fmt::format("missing argument\nusage: {}", spec.usage));
  if (n > spec.max_positionals)
    throw core::UsageError(fmt::format("unexpected argument '{}'\nusage: {}",
                                       args.positionals[spec.max_positionals], spec.usage));
  return args;
}

}  // namespace loom::cli
