// Bookkeeping of the operations a communicator has queued on the GPU and not yet seen finish:
// which one is running and since when, whether it ran past its timeout, and the
// communicator's first failure, handed to every operation still pending.
//
// There is no CUDA here: an OpProgress says where an operation stands (cuda_progress.h reads
// CUDA events; tests use fakes), so the timeout and failure logic runs on machines without
// a GPU.
#pragma once

#include <loom/sdk.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace loom::comm_nccl {

using Clock = std::chrono::steady_clock;

/// A failure: its status code and one-line message (which names the operation and group).
struct Failure {
  Code code = Code::kInternal;
  std::string message;
};

/// The failure as a Status (the caller releases it).
Status to_status(const Failure& failure) noexcept;

/// "5 s", "1.5 s" or "200 ms": a timeout for messages.
std::string duration_text(int64_t milliseconds);

/// Where one queued operation stands on the device. Methods may be called from any thread.
class OpProgress {
 public:
  enum class Phase {
    kQueued,   ///< waiting for the work it was ordered after (the caller's stream)
    kRunning,  ///< its inputs are ready; once the operations before it are done, it runs
    kDone,     ///< finished on the device
    kError,    ///< the device reported an error (the CUDA context is broken)
  };
  virtual ~OpProgress() = default;
  /// Never blocks. On kError, `*error` says what the device reported.
  virtual Phase phase(std::string* error) noexcept = 0;
  /// Makes the stream the operation was issued against wait for the operation's end, so
  /// work queued there later sees its result. False with `*error` set when the device
  /// refuses.
  virtual bool order_caller(std::string* error) noexcept = 0;
};

/// One queued operation, shared by the tracker and the operation's handle (which may outlive
/// the communicator).
class OpRecord {
 public:
  /// \param what        "all_reduce on group 'tp/0' (rank 0 of 2)"
  /// \param timeout_ms  how long it may run once started
  /// \param progress    its probe; owned
  OpRecord(std::string what, int64_t timeout_ms, std::unique_ptr<OpProgress> progress);

  const std::string& what() const { return what_; }
  int64_t timeout_ms() const { return timeout_ms_; }
  OpProgress& progress() { return *progress_; }

  /// Records the result: nullopt for success. Only the first call counts.
  void finish(std::optional<Failure> failure);
  /// Whether the result is known; then `*failure` is the failure, or nullopt on success.
  bool result(std::optional<Failure>* failure) const;
  /// Whether the result is known.
  bool finished() const;

 private:
  friend class OpTracker;
  const std::string what_;
  const int64_t timeout_ms_;
  const std::unique_ptr<OpProgress> progress_;
  mutable std::mutex mutex_;
  bool finished_ = false;
  std::optional<Failure> failure_;
  std::optional<Clock::time_point> started_;  // the tracker's: when it was first seen running
};

/// The queue of one communicator's pending operations, in issue order (the order they run in
/// on the communicator's stream). Thread-safe.
///
/// An operation's clock starts when it is first seen running (its inputs ready and every
/// earlier operation done), not when it was queued: a host that runs ahead of the GPU, or a
/// long computation before the collective, is not a communication timeout.
class OpTracker {
 public:
  /// Appends an operation just queued.
  void add(std::shared_ptr<OpRecord> op);

  /// Retires the finished operations at the front (finishing them with success), starts the
  /// clock of the one now running, and returns a failure when that one ran past its timeout
  /// (kDeadlineExceeded) or the device reported an error (kInternal). It fails nothing
  /// itself: the caller aborts the communicator, then calls fail(). Nothing once failed.
  /// \param now  the current time (a parameter so tests can drive the clock)
  std::optional<Failure> poll(Clock::time_point now);

  /// Remembers `failure` as the communicator's and finishes every pending operation with it.
  /// Returns false, changing nothing, when the communicator had failed already.
  /// \param reported  true when the caller returns the failure to whoever issued the
  ///                  operation (so refusal() goes straight to kFailedPrecondition)
  bool fail(const Failure& failure, bool reported = false);

  /// The communicator's failure, if any.
  std::optional<Failure> failure() const;

  /// What an operation issued after the failure returns: the failure's own code and message
  /// the first time anyone is told (so its code, e.g. kDeadlineExceeded, reaches the caller
  /// even when the failed operation was synchronous and had already returned), after that
  /// kFailedPrecondition. Nullopt while the communicator is usable.
  /// \param what  the new operation's description
  std::optional<Failure> refusal(const std::string& what);

  /// Notes that a caller has been given the failure (a synchronous call that waited for
  /// the failed operation), so refusal() goes straight to kFailedPrecondition. No-op while
  /// the communicator is usable.
  void mark_reported();

  /// The description of the oldest pending operation ("" when none): the one a
  /// communicator-wide error (NCCL's asynchronous error) is reported against.
  std::string front_what() const;

  /// Number of pending operations.
  size_t pending() const;

  /// Waits until nothing is pending or `deadline` passes; true when nothing is pending.
  bool wait_idle(Clock::time_point deadline);

 private:
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  std::deque<std::shared_ptr<OpRecord>> pending_;
  std::optional<Failure> failure_;
  bool failure_reported_ = false;
};

}  // namespace loom::comm_nccl
