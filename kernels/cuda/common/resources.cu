// Per-device and per-stream state of the CUDA kernel families (resources.cuh).
#include <loom/cpp/error.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/resources.cuh"

namespace loom::kernels::cuda {

int current_device(const char* op, const TensorView& t) {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  if (t.device.index != device)
    throw Error(Code::kInvalidArgument,
                std::string(op) + ": tensors are on cuda:" + std::to_string(t.device.index) +
                    " but the current device is cuda:" + std::to_string(device) +
                    "; call cudaSetDevice (or run the op from that device's thread) first");
  return device;
}

int compute_capability(int device) noexcept {
  static std::mutex mutex;
  static auto* known = new std::map<int, int>();  // leaked
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known->find(device);
  if (it != known->end()) return it->second;
  int major = 0, minor = 0;
  int cc = 0;  // also kept when the runtime cannot tell: it will not later either
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess)
    cc = major * 10 + minor;
  else
    cudaGetLastError();  // clear it: the caller only asked
  return (*known)[device] = cc;
}

Scratch stream_scratch(int device, cudaStream_t stream) {
  static std::mutex mutex;
  static auto* buffers = new std::map<std::pair<int, cudaStream_t>, void*>();  // leaked
  std::lock_guard<std::mutex> lock(mutex);
  void*& data = (*buffers)[{device, stream}];
  if (data == nullptr) {
    cudaError_t status = malloc_outside_graphs(&data, kScratchBytes);
    if (status != cudaSuccess) {
      data = nullptr;
      buffers->erase({device, stream});
      cuda_check(status, "cudaMalloc of the CUDA kernels' 32 MiB stream scratch");
    }
  }
  return Scratch{data, kScratchBytes};
}

}  // namespace loom::kernels::cuda
