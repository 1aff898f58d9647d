// What the CUDA kernel benches (attention_bench, norm_bench) share: failing with one line,
// device tensors filled with reproducible bf16 values, and CUDA-event timing.
#pragma once

#include <cuda_runtime.h>
#include <loom/cpp/tensor.h>
#include <loom/kernel.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace loom::bench {

/// The bench's name, first word of its failure messages (set at the start of main).
inline const char* tool_name = "bench";

[[noreturn]] inline void die(const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", tool_name, why.c_str());
  std::exit(1);
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

inline void check(Status s, const char* what) {
  if (s.code != Code::kOk)
    die(std::string(what) + " failed (status " + std::to_string(static_cast<int>(s.code)) + ")");
}

/// bf16 bits of x (round to nearest even).
inline uint16_t bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

/// A device tensor of `shape` and `dtype`: bf16 filled with uniform values in [-1, 1) from
/// `seed`, anything else zeros.
struct DeviceTensor {
  TensorView v{};
  DeviceTensor(DType dt, std::vector<int64_t> shape, uint64_t seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
    void* data = nullptr;
    check(cudaMalloc(&data, bytes), "cudaMalloc");
    v = make_view(data, dt, shape.data(), static_cast<int32_t>(shape.size()),
                  Device{DeviceType::kCuda, 0});
    if (dt == DType::kBF16) {
      std::vector<uint16_t> host(static_cast<size_t>(n));
      uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
      for (auto& x : host) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = bf16(static_cast<float>((s >> 40) & 0xffffff) / 8388608.0f - 1.0f);
      }
      check(cudaMemcpy(v.data, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    } else {
      check(cudaMemset(v.data, 0, bytes), "cudaMemset");
    }
  }
  ~DeviceTensor() { cudaFree(v.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
};

/// Milliseconds per iteration of `body` on the legacy stream (3 warm-up runs first).
template <class F>
double time_ms(int iterations, F&& body) {
  for (int i = 0; i < 3; ++i) body();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a, nullptr), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) body();
  check(cudaEventRecord(b, nullptr), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iterations;
}

}  // namespace loom::bench
