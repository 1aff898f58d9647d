#include "plugins/comm_nccl/cuda_progress.h"

namespace loom::comm_nccl {
namespace {

// `*error` = "<call>: <cuda error>"; never throws (out of memory leaves it empty).
void describe(std::string* error, const char* call, cudaError_t status) noexcept {
  try {
    *error = std::string(call) + ": " + cuda_error_text(status);
  } catch (...) {
  }
}

}  // namespace

std::string cuda_error_text(cudaError_t error) {
  const char* name = cudaGetErrorName(error);
  const char* text = cudaGetErrorString(error);
  return std::string(name != nullptr ? name : "cudaError") + ": " +
         (text != nullptr ? text : "unknown error");
}

void cuda_check(cudaError_t error, const std::string& what, const char* call) {
  if (error != cudaSuccess)
    fail(Code::kInternal, what + ": " + call + ": " + cuda_error_text(error));
}

DeviceGuard::DeviceGuard(int32_t device, const std::string& what) {
  int current = -1;
  cuda_check(cudaGetDevice(&current), what, "cudaGetDevice");
  if (current == device) return;
  cuda_check(cudaSetDevice(device), what, "cudaSetDevice");
  previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

CudaProgress::CudaProgress(cudaStream_t caller, int32_t device, const std::string& what)
    : caller_(caller), device_(device) {
  cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), what, "cudaEventCreate");
  const cudaError_t made = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
  if (made != cudaSuccess) {
    (void)cudaEventDestroy(ready_);
    cuda_check(made, what, "cudaEventCreate");
  }
}

CudaProgress::~CudaProgress() {
  (void)cudaEventDestroy(ready_);
  (void)cudaEventDestroy(done_);
}

OpProgress::Phase CudaProgress::phase(std::string* error) noexcept {
  const cudaError_t done = cudaEventQuery(done_);
  if (done == cudaSuccess) return Phase::kDone;
  if (done != cudaErrorNotReady) {
    describe(error, "cudaEventQuery", done);
    return Phase::kError;
  }
  if (ready_seen_.load(std::memory_order_acquire)) return Phase::kRunning;
  const cudaError_t ready = cudaEventQuery(ready_);
  if (ready == cudaSuccess) {
    ready_seen_.store(true, std::memory_order_release);
    return Phase::kRunning;
  }
  if (ready != cudaErrorNotReady) {
    describe(error, "cudaEventQuery", ready);
    return Phase::kError;
  }
  return Phase::kQueued;
}

bool CudaProgress::order_caller(std::string* error) noexcept {
  // The waiting thread may have another device current, and a null stream means the legacy
  // stream of the current device: make the operation's device current for the call.
  int current = -1;
  cudaError_t status = cudaGetDevice(&current);
  if (status == cudaSuccess && current != device_) status = cudaSetDevice(device_);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(caller_, done_, 0);
  if (current >= 0 && current != device_) (void)cudaSetDevice(current);
  if (status == cudaSuccess) return true;
  describe(error, "cudaStreamWaitEvent", status);
  return false;
}

}  // namespace loom::comm_nccl
