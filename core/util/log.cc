#include "core/util/log.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace loom::core {
namespace {

LogLevel initial_level() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("LOOM_LOG_LEVEL")) parse_log_level(env, &level);
  return level;
}

std::atomic<int> g_level{static_cast<int>(initial_level())};
std::mutex g_mutex;  // keeps lines from several threads whole

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

bool parse_log_level(std::string_view text, LogLevel* out) {
  if (text == "debug")
    *out = LogLevel::kDebug;
  else if (text == "info")
    *out = LogLevel::kInfo;
  else if (text == "warning")
    *out = LogLevel::kWarning;
  else if (text == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

void log(LogLevel level, std::string_view source, std::string_view message) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::string line = "[loom ";
  line += level_name(level);
  line += "] ";
  if (!source.empty()) {
    line += source;
    line += ": ";
  }
  line += message;
  line += '\n';
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace loom::core
