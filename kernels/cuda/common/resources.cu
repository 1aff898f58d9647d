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

void allow_dynamic_smem(const void* kernel, size_t bytes, const char* op) {
  if (bytes == 0) return;
  // What the kernel may take now: by default 48 KiB less its static shared memory (a kernel with
  // some of both needs the opt-in below 48 KiB of dynamic memory), or what an earlier call set.
  cudaFuncAttributes now{};
  cuda_check(cudaFuncGetAttributes(&now, kernel),
             (std::string(op) + ": cudaFuncGetAttributes").c_str());
  if (bytes <= static_cast<size_t>(now.maxDynamicSharedSizeBytes)) return;
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             (std::string(op) + ": cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " +
              std::to_string(bytes) + " bytes)")
                 .c_str());
}

namespace {

// The value `ask` gives for `device`, asked once per (device, ask) and kept (also a 0 the
// runtime could not tell: it will not later either).
int cached_device_value(int device, int (*ask)(int)) noexcept {
  static std::mutex mutex;
  static auto* known = new std::map<std::pair<int, int (*)(int)>, int>();  // leaked
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known->find({device, ask});
  if (it != known->end()) return it->second;
  return (*known)[{device, ask}] = ask(device);
}

// A device attribute, 0 when the runtime cannot tell (the error cleared: the caller only
// asked).
int attribute(cudaDeviceAttr a, int device) noexcept {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, a, device) == cudaSuccess) return v;
  cudaGetLastError();
  return 0;
}

}  // namespace

int compute_capability(int device) noexcept {
  return cached_device_value(device, [](int d) {
    const int major = attribute(cudaDevAttrComputeCapabilityMajor, d);
    const int minor = attribute(cudaDevAttrComputeCapabilityMinor, d);
    return major > 0 ? major * 10 + minor : 0;
  });
}

int multiprocessor_count(int device) noexcept {
  return cached_device_value(device,
                             [](int d) { return attribute(cudaDevAttrMultiProcessorCount, d); });
}

int shared_memory_per_multiprocessor(int device) noexcept {
  return cached_device_value(
      device, [](int d) { return attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, d); });
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
