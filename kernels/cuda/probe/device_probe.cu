#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/probe/device_probe.h"

namespace loom::cuda_probe {
namespace {

constexpr int kThreadsPerBlock = 256;

// One thread per element; n < 2^31 so the grid, at most 2^23 blocks, always fits.
__global__ void saxpy_kernel(float a, const float* __restrict__ x, const float* __restrict__ y,
                             float* __restrict__ out, int n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}

// Records why `what` failed and clears the runtime's last error, so that a later, unrelated
// cudaGetLastError does not report this failure again.
bool check(cudaError_t status, const char* what, std::string* error) {
  if (status == cudaSuccess) return true;
  cudaGetLastError();
  if (error != nullptr) {
    *error = std::string(what) + " failed: " + cudaGetErrorName(status) + ": " +
             cudaGetErrorString(status);
  }
  return false;
}

// Owns one device allocation, so that every early return frees it.
class DeviceFloats {
 public:
  DeviceFloats() = default;
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() {
    if (data_ != nullptr) cudaFree(data_);
  }

  cudaError_t allocate(int n) { return cudaMalloc(&data_, static_cast<size_t>(n) * sizeof(float)); }
  float* data() const { return data_; }

 private:
  float* data_ = nullptr;
};

}  // namespace

DeviceQuery query_devices() {
  DeviceQuery query;
  int count = 0;
  if (!check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", &query.error)) return query;
  if (count == 0) {
    query.error = "the CUDA runtime reports no devices";
    return query;
  }
  query.count = count;
  return query;
}

bool saxpy(float a, const float* x, const float* y, float* out, int n, std::string* error) {
  if (n < 0 || (n > 0 && (x == nullptr || y == nullptr || out == nullptr))) {
    if (error != nullptr) {
      *error = "saxpy: invalid arguments (n = " + std::to_string(n) +
               ", x, y and out must be non-null when n > 0)";
    }
    return false;
  }
  if (n == 0) return true;

  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  DeviceFloats d_x, d_y, d_out;  // (n,) each
  if (!check(cudaSetDevice(0), "cudaSetDevice(0)", error) ||
      !check(d_x.allocate(n), "cudaMalloc", error) ||
      !check(d_y.allocate(n), "cudaMalloc", error) ||
      !check(d_out.allocate(n), "cudaMalloc", error) ||
      !check(cudaMemcpy(d_x.data(), x, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(x)", error) ||
      !check(cudaMemcpy(d_y.data(), y, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(y)", error)) {
    return false;
  }
  const int blocks = n / kThreadsPerBlock + (n % kThreadsPerBlock != 0);  // n + 255 may overflow
  saxpy_kernel<<<blocks, kThreadsPerBlock>>>(a, d_x.data(), d_y.data(), d_out.data(), n);
  // The launch error is reported at once; a fault inside the kernel surfaces at the copy,
  // which waits for the kernel to finish.
  return check(cudaGetLastError(), "saxpy_kernel launch", error) &&
         check(cudaMemcpy(out, d_out.data(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(out)",
               error);
}

}  // namespace loom::cuda_probe
