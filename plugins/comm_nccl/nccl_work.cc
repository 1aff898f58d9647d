#include "plugins/comm_nccl/nccl_work.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace loom::comm_nccl {
namespace {

Status failed(const OpRecord& op, const std::string& error) noexcept {
  try {
    const std::string message = op.what() + ": " + error;
    return make_status(Code::kInternal, message.c_str(), message.size());
  } catch (...) {
    return make_status(Code::kInternal, "out of host memory while reporting a CUDA error");
  }
}

// await_op, except that copying a failure may throw std::bad_alloc.
Status await_op_or_throw(OpRecord& op, bool blocking) {
  std::optional<Failure> failure;
  if (op.result(&failure) && failure) return to_status(*failure);
  std::string error;
  if (!op.progress().order_caller(&error)) return failed(op, error);
  if (!blocking) return ok_status();
  // Collectives take microseconds to milliseconds: yield at first, then sleep a little
  // longer each round, up to 1 ms, so a long wait costs no core.
  auto pause = std::chrono::microseconds(20);
  for (int round = 0;; ++round) {
    if (op.result(&failure)) return failure ? to_status(*failure) : ok_status();
    switch (op.progress().phase(&error)) {
      case OpProgress::Phase::kDone:
        return ok_status();
      case OpProgress::Phase::kError:
        return failed(op, error);
      case OpProgress::Phase::kQueued:
      case OpProgress::Phase::kRunning:
        break;
    }
    if (round < 100) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
}

}  // namespace

Status await_op(OpRecord& op, bool blocking) noexcept {
  try {
    return await_op_or_throw(op, blocking);
  } catch (...) {
    return make_status(Code::kResourceExhausted, "out of host memory");
  }
}

NcclWork::~NcclWork() {
  Status status = wait();
  status_release(&status);
}

Status NcclWork::wait() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!waited_) {
    Status status = await_op(*op_, blocking_);
    code_ = status.code;
    try {
      if (status.message != nullptr) message_ = status.message;
    } catch (...) {
      // Out of memory: the code is kept, the message is lost.
    }
    status_release(&status);
    waited_ = true;
  }
  if (code_ == Code::kOk) return ok_status();
  return make_status(code_, message_.c_str(), message_.size());
}

bool NcclWork::done() noexcept {
  if (op_->finished()) return true;
  std::string error;
  const OpProgress::Phase phase = op_->progress().phase(&error);
  return phase == OpProgress::Phase::kDone || phase == OpProgress::Phase::kError;
}

}  // namespace loom::comm_nccl
