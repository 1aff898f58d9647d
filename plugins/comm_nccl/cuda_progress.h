// The CUDA side of an operation's progress: two events per queued operation, and the small
// CUDA helpers the communicator shares (the current-device guard, error text).
//
//   caller stream:  ... work before the call ... [ready] ............ wait(done) ...
//   NCCL stream:                           wait(ready) [ncclXxx] [done]
//
// `ready` is recorded on the stream the caller issued against (the device's compute stream
// unless it passed one) and the communicator's stream waits for it, so NCCL reads inputs
// that the kernels before the call have written. `done` is recorded after the NCCL call; the
// caller's stream waits for it when a synchronous call returns or a handle is waited on, so
// the kernels after it read the result, and memory the caching allocator hands out again on
// the compute stream is never reused while NCCL still touches it.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

#include "plugins/comm_nccl/op_tracker.h"

namespace loom::comm_nccl {

/// "cudaErrorNoDevice: no CUDA-capable device is detected".
std::string cuda_error_text(cudaError_t error);

/// Throws Error(kInternal) "<what>: <call>: <cuda error>" unless `error` is cudaSuccess.
void cuda_check(cudaError_t error, const std::string& what, const char* call);

/// Makes `device` current for the scope and restores the previous device after.
class DeviceGuard {
 public:
  /// Throws Error(kInternal) naming `what` when the device cannot be made current.
  DeviceGuard(int32_t device, const std::string& what);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

/// The progress of one operation, read from its two events (made without timing, the cheap
/// kind). The events are destroyed with this object; CUDA keeps them alive until the work
/// recorded on them has run.
class CudaProgress final : public OpProgress {
 public:
  /// \param caller  the stream the operation was issued against (null: the legacy default
  ///                stream of `device`)
  /// \param device  the device of the events and the communicator (current when called)
  /// \param what    the operation's description, for errors
  /// Throws Error(kInternal) when the events cannot be made.
  CudaProgress(cudaStream_t caller, int32_t device, const std::string& what);
  ~CudaProgress() override;

  cudaStream_t caller() const { return caller_; }
  cudaEvent_t ready() const { return ready_; }
  cudaEvent_t done() const { return done_; }

  Phase phase(std::string* error) noexcept override;
  bool order_caller(std::string* error) noexcept override;

 private:
  cudaStream_t caller_;
  int32_t device_;  // a null `caller_` names this device's legacy stream
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
  std::atomic<bool> ready_seen_{false};  // `ready` completed (it never un-completes)
};

}  // namespace loom::comm_nccl
