// The handle of an asynchronous NCCL operation, and the wait that synchronous calls share.
#pragma once

#include <loom/sdk.h>

#include <memory>
#include <mutex>
#include <string>

#include "plugins/comm_nccl/op_tracker.h"

namespace loom::comm_nccl {

/// What waiting for a queued operation means here. When its failure is already known
/// (timeout, peer gone, communicator aborted) that failure is returned. Otherwise the stream
/// it was issued against is made to wait for its end (kernels queued there later see the
/// result) and, only with `blocking`, the host waits too until it finished on the GPU or
/// failed; the watchdog bounds that wait by the operation's timeout.
Status await_op(OpRecord& op, bool blocking) noexcept;

/// ICommWork over one queued operation. Shares the operation's record with the communicator's
/// watchdog, so it may outlive the communicator (whose destruction finishes every record).
class NcclWork final : public Object<ICommWork> {
 public:
  NcclWork(std::shared_ptr<OpRecord> op, bool blocking) : op_(std::move(op)), blocking_(blocking) {}
  /// An unwaited handle waits first (await_op), so the caller's stream is ordered after the
  /// operation before its memory can be reused.
  ~NcclWork() override;

  /// await_op; the first call's status is kept and returned by every later call.
  Status wait() noexcept override;
  /// True once the operation finished on the GPU or failed. Never blocks.
  bool done() noexcept override;

 private:
  const std::shared_ptr<OpRecord> op_;
  const bool blocking_;
  std::mutex mutex_;
  bool waited_ = false;
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace loom::comm_nccl
