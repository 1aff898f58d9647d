// What the CUDA kernel benches (attention_bench, norm_bench, fp8_quantize_bench) share:
// failing with one line, the device check, device tensors filled with reproducible bf16
// values, one kernel's call with its workspace, and CUDA-event timing.
#pragma once

#include <cuda_runtime.h>
#include <loom/cpp/tensor.h>
#include <loom/kernel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
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

/// The N of `--iterations N`, the benches' one argument (`fallback` without it); fails naming
/// the usage on anything else.
inline int parse_iterations(int argc, char** argv, int fallback) {
  int iterations = fallback;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
      iterations = std::max(1, std::atoi(argv[++i]));
    else
      die(std::string("unknown argument ") + argv[i] + " (usage: " + tool_name +
          " [--iterations N])");
  }
  return iterations;
}

/// Device 0's properties; without a device, fails naming the CUDA runtime's reason.
inline cudaDeviceProp require_device() {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0)
    die(std::string("no CUDA device (") +
        (e != cudaSuccess ? cudaGetErrorString(e) : "no devices") + ")");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return prop;
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

/// The kernel of `op` keyed `dtype` among `all`; fails when there is none.
inline const KernelDesc& find_kernel(const std::vector<KernelDesc>& all, const char* op,
                                     DType dtype) {
  for (const KernelDesc& k : all)
    if (std::strcmp(k.op, op) == 0 && k.dtype == dtype) return k;
  die(std::string("no CUDA kernel for ") + op);
}

/// One kernel's call with its own workspace (cudaMalloc'd once); fails when the kernel
/// declines it.
struct KernelCall {
  const KernelDesc* k;
  std::vector<TensorView> in, out;
  OpCall call{};
  void* ws = nullptr;
  KernelCall(const KernelDesc& kd, std::vector<TensorView> i, std::vector<TensorView> o,
             const void* attrs, uint64_t attrs_size)
      : k(&kd), in(std::move(i)), out(std::move(o)) {
    call = OpCall{sizeof(OpCall),
                  in.data(),
                  static_cast<int32_t>(in.size()),
                  out.data(),
                  static_cast<int32_t>(out.size()),
                  attrs,
                  attrs_size,
                  nullptr,
                  nullptr,
                  0};
    if (k->supports != nullptr && !k->supports(&call))
      die(std::string(k->op) + " (" + k->name + ") declines");
    const uint64_t bytes = k->workspace != nullptr ? k->workspace(&call) : 0;
    if (bytes > 0) check(cudaMalloc(&ws, bytes), "cudaMalloc workspace");
    call.workspace = ws;
    call.workspace_bytes = bytes;
  }
  ~KernelCall() { cudaFree(ws); }
  KernelCall(const KernelCall&) = delete;
  KernelCall& operator=(const KernelCall&) = delete;
  void run() { check(k->fn(&call), k->op); }
  /// The call's cost by the kernel's cost function.
  OpCost cost() {
    OpCost c{};
    check(k->cost(&call, &c), "cost");
    return c;
  }
  /// The ideal bytes of the call (read + written).
  double bytes() {
    const OpCost c = cost();
    return c.bytes_read + c.bytes_written;
  }
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
