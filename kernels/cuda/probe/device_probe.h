// Asks the CUDA runtime what devices this machine has, and runs one tiny kernel on one.
//
// Plain C++: no CUDA types, so .cc code (tests, the CUDA kernels plugin deciding whether to
// register itself) includes it without nvcc.

#pragma once

#include <string>

namespace loom::cuda_probe {

// What the CUDA runtime reports about the devices of this process.
struct DeviceQuery {
  // Number of usable CUDA devices; 0 whenever `error` is set.
  int count = 0;
  // Why no device can be used, for example "cudaGetDeviceCount failed:
  // cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"
  // on a machine without a driver; empty when `count` > 0.
  std::string error;
};

// Enumerates CUDA devices. Never throws or aborts: a runtime error, such as a missing driver,
// is reported as `count` 0 with the runtime's message.
DeviceQuery query_devices();

// Computes out[i] = a * x[i] + y[i] for i in [0, n) on device 0: copies `x` and `y` to the
// device, runs a kernel, copies the result back and frees the device memory.
//
// a:     the scale applied to `x`.
// x:     host array of `n` floats; may be null only when `n` is 0.
// y:     host array of `n` floats; may be null only when `n` is 0.
// out:   host array of `n` floats that receives the result; may alias `x` or `y`.
// n:     number of elements, >= 0. With `n` 0 nothing is done and no device is needed.
// error: where the reason for a failure is written (invalid arguments, or the CUDA call that
//        failed with its error name and message); may be null. Left unchanged on success.
// Returns true on success; on failure `out` is unspecified.
bool saxpy(float a, const float* x, const float* y, float* out, int n, std::string* error);

}  // namespace loom::cuda_probe
