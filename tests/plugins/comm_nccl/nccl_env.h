// Test environment of the NCCL backend: the real plugin loaded through the core from the
// test's runfiles, device tensors filled from and read into comm_gloo's HostTensor, and the
// GPU count that decides which tests run. The rendezvous store, Outcome and the rank threads
// are comm_gloo's (tests/plugins/comm_gloo/comm_env.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/component/builder.h"
#include "tests/plugins/comm_gloo/comm_env.h"

namespace loom::testing {

/// Builds comm_backend "nccl" from `node` through the core (plugin loaded once per process).
ObjectPtr make_nccl_backend(const nlohmann::json& node = {{"impl", "nccl"}});

/// The number of usable CUDA devices; 0 with `*reason` set when there is none.
int cuda_devices(std::string* reason);

/// Skips the test, printing "[cuda] skipped: <reason>", unless the machine has `needed` GPUs.
#define LOOM_NEED_GPUS(needed)                                                                 \
  do {                                                                                         \
    std::string reason_;                                                                       \
    const int have_ = ::loom::testing::cuda_devices(&reason_);                                 \
    if (have_ < (needed)) {                                                                    \
      if (have_ > 0)                                                                           \
        reason_ = "needs " + std::to_string(needed) + " GPUs, found " + std::to_string(have_); \
      std::printf("[cuda] skipped: %s\n", reason_.c_str());                                    \
      GTEST_SKIP() << reason_;                                                                 \
    }                                                                                          \
  } while (0)

/// Fails the test (ADD_FAILURE) naming `call` unless `error` is cudaSuccess.
bool cuda_ok(cudaError_t error, const char* call);

/// A 1-D tensor on the current CUDA device that owns its memory (cudaMalloc).
class DeviceTensor {
 public:
  DeviceTensor(DType dtype, size_t n);
  ~DeviceTensor();
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  /// A (n,) CUDA view of the memory, or of `count` elements from element `offset`.
  TensorView view() const { return view(0, n_); }
  TensorView view(size_t offset, size_t count) const;
  /// Copies `host` (same dtype and size) in and waits for the device.
  void upload(const HostTensor& host);
  /// Waits for the device and copies the contents out.
  HostTensor download() const;
  void* data() const { return data_; }

 private:
  DType dtype_;
  size_t n_;
  int device_ = 0;
  void* data_ = nullptr;
};

}  // namespace loom::testing
