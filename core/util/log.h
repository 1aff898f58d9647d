// The core's logger: one line per message on stderr, with level and source.
#pragma once

#include <string>
#include <string_view>

#include "loom/types.h"

namespace loom::core {

/// Sets the lowest level that is printed (default kInfo; LOOM_LOG_LEVEL overrides).
void set_log_level(LogLevel level);

/// A byte count for people: "48.9 MiB" (one decimal, binary units up to TiB).
std::string human_bytes(double bytes);
/// Lowest level printed.
LogLevel log_level();
/// Parses "debug" / "info" / "warning" / "error"; returns false for anything else.
bool parse_log_level(std::string_view text, LogLevel* out);

/// Prints "[loom LEVEL] source: message" to stderr when `level` is enabled.
void log(LogLevel level, std::string_view source, std::string_view message);

inline void log_info(std::string_view source, std::string_view m) {
  log(LogLevel::kInfo, source, m);
}
inline void log_warning(std::string_view source, std::string_view m) {
  log(LogLevel::kWarning, source, m);
}
inline void log_debug(std::string_view source, std::string_view m) {
  log(LogLevel::kDebug, source, m);
}

}  // namespace loom::core
