#include "core/parallel/comm_stats.h"

namespace loom::core {

void CommStats::add(const std::string& group, const std::string& op, int64_t bytes,
                    double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = entries_[group + " " + op];
  ++e.calls;
  e.bytes += bytes;
  e.seconds += seconds;
}

void CommStats::add_wait(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  blocked_ += seconds;
}

double CommStats::blocked_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocked_;
}

std::map<std::string, CommStats::Entry> CommStats::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

void CommStats::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  blocked_ = 0;
}

}  // namespace loom::core
