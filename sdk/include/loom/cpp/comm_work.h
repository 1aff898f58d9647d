// C++ conveniences for ICommunicator's asynchronous operations (header-only; nothing here
// crosses the boundary): the interface-version check a caller makes before using them, an
// owning pointer for handles, and a handle that a communicator completes (from a worker
// thread, or at once for an operation done synchronously).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "loom/cpp/object.h"
#include "loom/kinds/comm_backend.h"

namespace loom {

/// Whether `comm` implements communicator 1.1, i.e. has the `*_async` methods. Call them
/// only when this is true: an object built against older headers has no such entries.
inline bool has_async(const ICommunicator& comm) noexcept {
  InterfaceInfo info = comm.interface_info();
  return info.major == 1 && info.minor >= 1;
}

/// Destroys a handle through the library that made it.
struct CommWorkDeleter {
  void operator()(ICommWork* work) const noexcept {
    if (work != nullptr) work->destroy();
  }
};
using CommWorkPtr = std::unique_ptr<ICommWork, CommWorkDeleter>;

/// The result of one operation, set once by whoever runs it and read by every wait().
class WorkCompletion {
 public:
  /// Records `status` (taking and releasing its message) and wakes the waiters. Only the
  /// first call counts.
  void finish(Status status) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!done_) {
        code_ = status.code;
        try {
          if (status.message != nullptr) message_ = status.message;
        } catch (...) {
          // Out of memory: the code is kept, the message is lost.
        }
        done_ = true;
      }
    }
    status_release(&status);
    changed_.notify_all();
  }
  /// Blocks until finish() and returns a copy of the status it recorded.
  Status wait() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_; });
    if (code_ == Code::kOk) return ok_status();
    return make_status(code_, message_.c_str(), message_.size());
  }
  bool done() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;
  Code code_ = Code::kOk;
  std::string message_;
};

/// A handle over a WorkCompletion that the communicator shares (so the handle may outlive
/// the communicator). Destroying it waits for the operation, as ICommWork requires.
class CompletionWork final : public Object<ICommWork> {
 public:
  explicit CompletionWork(std::shared_ptr<WorkCompletion> completion)
      : completion_(std::move(completion)) {}
  ~CompletionWork() override {
    Status status = completion_->wait();
    status_release(&status);
  }
  Status wait() noexcept override { return completion_->wait(); }
  bool done() noexcept override { return completion_->done(); }

 private:
  std::shared_ptr<WorkCompletion> completion_;
};

/// Sets `*out` to a finished handle whose wait() returns `status` (taken over): for an
/// operation done synchronously. Returns kOk, or kResourceExhausted (with `*out` null and
/// `status` released) when the handle cannot be allocated.
inline Status completed_work(Status status, ICommWork** out) noexcept {
  if (out == nullptr) {
    status_release(&status);
    return make_status(Code::kInvalidArgument, "the handle pointer `out` is null");
  }
  *out = nullptr;
  try {
    auto completion = std::make_shared<WorkCompletion>();
    completion->finish(status);  // takes the message
    status = ok_status();
    *out = new CompletionWork(std::move(completion));
    return ok_status();
  } catch (...) {
    status_release(&status);
    return make_status(Code::kResourceExhausted, "out of host memory");
  }
}

}  // namespace loom
