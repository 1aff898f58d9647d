// Turning CUDA runtime errors into loom errors, for the host side of the CUDA kernels.
//
// Every runtime call that can fail goes through cuda_check, which throws loom::Error with
// the call, the runtime's error name and its message; a kernel's `fn` runs inside
// loom::guard, so the error reaches the module as a Status that names the op.
#pragma once

#include <cuda_runtime.h>
#include <loom/cpp/error.h>
#include <loom/kernel.h>

#include <string>

namespace loom::kernels::cuda {

/// Throws Error naming `what` when `status` is not cudaSuccess (kResourceExhausted for an
/// allocation failure, kUnavailable when there is no usable device, kInternal otherwise),
/// after clearing the runtime's sticky-free last error.
inline void cuda_check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  Code code = Code::kInternal;
  if (status == cudaErrorMemoryAllocation) code = Code::kResourceExhausted;
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver)
    code = Code::kUnavailable;
  throw Error(code, std::string(what) + " failed: " + cudaGetErrorName(status) + ": " +
                        cudaGetErrorString(status));
}

/// Checks that the kernel launch just made by `op` was accepted (bad configuration, no
/// kernel image for this GPU); errors of the running kernel surface at the next
/// synchronisation.
inline void launch_check(const char* op) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(Code::kInternal, std::string(op) + ": kernel launch failed: " +
                                     cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

/// The stream this thread is capturing a graph on (CudaRuntime::capture_begin sets it and
/// capture_end clears it), or null. While it is set, it is the compute stream: the legacy
/// default stream cannot be captured, and touching it would break the capture.
inline thread_local cudaStream_t t_capture_stream = nullptr;

/// The stream of a call: OpCall::stream, or when null the compute stream of loom's CUDA
/// runtime (loom/device.h): the legacy default stream, or the capture stream while this
/// thread captures a graph.
inline cudaStream_t stream_of(const OpCall* call) {
  return call->stream != nullptr ? static_cast<cudaStream_t>(call->stream) : t_capture_stream;
}

/// cudaMalloc of memory that outlives every graph (a lazily made scratch, a segment of the
/// caching allocator), callable while this thread captures one. Stream capture counts
/// cudaMalloc as unsafe in the capturing thread because a replay does not redo it; nothing
/// loom captures depends on that, so the call runs in relaxed mode.
inline cudaError_t malloc_outside_graphs(void** pointer, size_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t status = cudaThreadExchangeStreamCaptureMode(&mode);
  if (status != cudaSuccess) return status;
  status = cudaMalloc(pointer, bytes);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return status;
}

/// Blocks of `threads` threads that cover `n` items (at least 1).
inline unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace loom::kernels::cuda
