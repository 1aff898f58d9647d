// CommStats: how much time this rank spent in communication, per operation kind, for the
// progress line and `loom bench` (the share of a step spent communicating).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace loom::core {

class CommStats {
 public:
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
    double seconds = 0;
  };
  /// Adds one call of `op` on group `group` that moved `bytes` (this rank's payload).
  void add(const std::string& group, const std::string& op, int64_t bytes, double seconds);
  /// Seconds spent blocked in communication since the last reset (calls on the
  /// training thread plus waits for asynchronous ones).
  double blocked_seconds() const;
  /// Adds time the training thread waited for an asynchronous operation.
  void add_wait(double seconds);
  /// Totals per "group op" since the last reset.
  std::map<std::string, Entry> entries() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  double blocked_ = 0;
};

/// Seconds since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace loom::core
