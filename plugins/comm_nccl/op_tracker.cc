#include "plugins/comm_nccl/op_tracker.h"

#include <cstdio>
#include <utility>

namespace loom::comm_nccl {

Status to_status(const Failure& failure) noexcept {
  return make_status(failure.code, failure.message.c_str(), failure.message.size());
}

std::string duration_text(int64_t ms) {
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(ms) / 1000.0);
  return text;
}

OpRecord::OpRecord(std::string what, int64_t timeout_ms, std::unique_ptr<OpProgress> progress)
    : what_(std::move(what)), timeout_ms_(timeout_ms), progress_(std::move(progress)) {}

void OpRecord::finish(std::optional<Failure> failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  failure_ = std::move(failure);
}

bool OpRecord::result(std::optional<Failure>* failure) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) *failure = failure_;
  return finished_;
}

bool OpRecord::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void OpTracker::add(std::shared_ptr<OpRecord> op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_) {
    op->finish(failure_);  // the communicator failed while it was being queued
    return;
  }
  pending_.push_back(std::move(op));
}

std::optional<Failure> OpTracker::poll(Clock::time_point now) {
  std::optional<Failure> found;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return std::nullopt;
    while (!pending_.empty()) {
      OpRecord& op = *pending_.front();
      std::string error;
      const OpProgress::Phase phase = op.progress().phase(&error);
      if (phase == OpProgress::Phase::kDone) {
        op.finish(std::nullopt);
        pending_.pop_front();
        continue;
      }
      if (phase == OpProgress::Phase::kError) {
        found = Failure{Code::kInternal,
                        op.what() + ": the GPU reported an error while it was pending (" + error +
                            "); the CUDA context is unusable, the first error is the cause"};
        break;
      }
      // Operations run in order: only the front one can be running.
      if (phase == OpProgress::Phase::kRunning && !op.started_) op.started_ = now;
      if (op.started_) {
        const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(now - *op.started_);
        if (ran.count() >= op.timeout_ms())
          found = Failure{Code::kDeadlineExceeded,
                          op.what() + ": timed out after " + duration_text(op.timeout_ms()) +
                              " waiting for the other ranks; a rank is stuck or dead, or the "
                              "ranks issued collectives in different orders (raise "
                              "parallel.timeout_s if it is just slow)"};
      }
      break;
    }
    if (!pending_.empty()) return found;
  }
  idle_.notify_all();
  return found;
}

bool OpTracker::fail(const Failure& failure, bool reported) {
  std::deque<std::shared_ptr<OpRecord>> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return false;
    failure_ = failure;
    failure_reported_ = reported;
    failed.swap(pending_);
  }
  for (auto& op : failed) op->finish(failure);
  idle_.notify_all();
  return true;
}

std::optional<Failure> OpTracker::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

std::optional<Failure> OpTracker::refusal(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) return std::nullopt;
  if (!failure_reported_) {
    failure_reported_ = true;
    return failure_;
  }
  return Failure{Code::kFailedPrecondition,
                 what + ": this communicator is unusable after an earlier failure (" +
                     failure_->message + "); the ranks are out of step, stop the run"};
}

void OpTracker::mark_reported() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_) failure_reported_ = true;
}

std::string OpTracker::front_what() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.empty() ? std::string() : pending_.front()->what();
}

size_t OpTracker::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

bool OpTracker::wait_idle(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return idle_.wait_until(lock, deadline, [&] { return pending_.empty(); });
}

}  // namespace loom::comm_nccl
