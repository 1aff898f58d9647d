// attention_bench: attention_fwd and attention_fwd + attention_bwd, bf16, causal, timed by
// CUDA events for each CUDA attention kernel: loom's own ("cuda") and cuDNN's ("cuda.cudnn",
// kernels/cuda/attention/cudnn_attention.h; the note column says whether cuDNN ran the calls
// or handed them back to loom's kernel, and why). Prints a Markdown table: milliseconds per
// call and TFLOP/s by loom's cost model (the kernels' cost functions: 4 * pairs * D forward,
// 8 * pairs * D backward, pairs = the visible (query, key) pairs).
//
//   attention_bench [--iterations N]
//
// Without a GPU it prints "attention_bench: no CUDA device (...)" and exits 1, as gemm_bench.
#include <cuda_runtime.h>
#include <loom/kernel.h>
#include <loom/ops/attention.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/cudnn_attention.h"

namespace {

using loom::DType;
using loom::KernelDesc;
using loom::OpCall;
using loom::OpCost;
using loom::TensorView;

struct Shape {
  int64_t b, t, h, d;
};
// GPT-2 124M's attention at B = 32, T = 1024 and the 1.3B LLaMA-style model's at B = 4,
// T = 2048 (the shapes of BENCHMARKS.md).
const std::vector<Shape> kShapes = {{32, 1024, 12, 64}, {4, 2048, 16, 128}};

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "attention_bench: %s\n", why.c_str());
  std::exit(1);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

void check(loom::Status s, const char* what) {
  if (s.code != loom::Code::kOk)
    die(std::string(what) + " failed (status " + std::to_string(static_cast<int>(s.code)) + ")");
}

// bf16 bits of x (round to nearest even).
uint16_t bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

// A device tensor of `shape` and `dtype`, filled with uniform values in [-1, 1) (floats) or
// left uninitialised (f32 outputs are written by the kernels).
struct DeviceTensor {
  TensorView v{};
  DeviceTensor(DType dt, std::vector<int64_t> shape, uint64_t seed) {
    v.dtype = dt;
    v.device = loom::Device{loom::DeviceType::kCuda, 0};
    v.ndim = static_cast<int32_t>(shape.size());
    int64_t n = 1;
    for (int i = v.ndim - 1; i >= 0; --i) {
      v.shape[i] = shape[i];
      v.strides[i] = n;
      n *= shape[i];
    }
    const size_t bytes = static_cast<size_t>(n) * (dt == DType::kF32 ? 4 : 2);
    check(cudaMalloc(&v.data, bytes), "cudaMalloc");
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

const KernelDesc* find(const std::vector<KernelDesc>& all, const char* op, const char* name) {
  for (const KernelDesc& k : all)
    if (std::strcmp(k.op, op) == 0 && std::strcmp(k.name, name) == 0 && k.dtype == DType::kBF16)
      return &k;
  return nullptr;
}

// One kernel's call with its own workspace (cudaMalloc'd once).
struct Call {
  const KernelDesc* k;
  std::vector<TensorView> in, out;
  OpCall call{};
  void* ws = nullptr;
  Call(const KernelDesc* kd, std::vector<TensorView> i, std::vector<TensorView> o,
       const loom::ops::AttentionAttrs* at)
      : k(kd), in(std::move(i)), out(std::move(o)) {
    call = OpCall{sizeof(OpCall),
                  in.data(),
                  static_cast<int32_t>(in.size()),
                  out.data(),
                  static_cast<int32_t>(out.size()),
                  at,
                  sizeof(*at),
                  nullptr,
                  nullptr,
                  0};
    if (k->supports != nullptr && !k->supports(&call)) die(std::string(k->name) + " declines");
    const uint64_t bytes = k->workspace != nullptr ? k->workspace(&call) : 0;
    if (bytes > 0) check(cudaMalloc(&ws, bytes), "cudaMalloc workspace");
    call.workspace = ws;
    call.workspace_bytes = bytes;
  }
  ~Call() { cudaFree(ws); }
  void run() { check(k->fn(&call), k->name); }
  double flops() {
    OpCost c{};
    check(k->cost(&call, &c), "cost");
    return c.flops;
  }
};

// Milliseconds per iteration of `body` (warm-up first).
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

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
      iterations = std::max(1, std::atoi(argv[++i]));
    else
      die(std::string("unknown argument ") + argv[i] +
          " (usage: attention_bench [--iterations N])");
  }
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0)
    die(std::string("no CUDA device (") +
        (e != cudaSuccess ? cudaGetErrorString(e) : "no devices") + ")");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::vector<KernelDesc> all;
  loom::kernels::cuda::add_attention_kernels(all);
  loom::kernels::cuda::add_cudnn_attention_kernels(all);
  std::printf("attention_bench: %s (sm_%d%d), cuDNN %lld, bf16, causal, %d iterations\n\n",
              prop.name, prop.major, prop.minor,
              static_cast<long long>(loom::kernels::cuda::cudnn_runtime_version()), iterations);
  std::printf(
      "| B, T, H, D | kernel | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | note |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Shape& s : kShapes) {
    DeviceTensor q(DType::kBF16, {s.b, s.t, s.h, s.d}, 1), k(DType::kBF16, {s.b, s.t, s.h, s.d}, 2),
        v(DType::kBF16, {s.b, s.t, s.h, s.d}, 3), o(DType::kBF16, {s.b, s.t, s.h, s.d}, 4),
        dout(DType::kBF16, {s.b, s.t, s.h, s.d}, 5), dq(DType::kBF16, {s.b, s.t, s.h, s.d}, 6),
        dk(DType::kBF16, {s.b, s.t, s.h, s.d}, 7), dv(DType::kBF16, {s.b, s.t, s.h, s.d}, 8),
        lse(DType::kF32, {s.b, s.h, s.t}, 0);
    TensorView none{};
    loom::ops::AttentionAttrs at{1.0f / std::sqrt(static_cast<float>(s.d)), 1, 0.0f, 0, 0};
    for (const char* name : {"cuda", loom::kernels::cuda::kCudnnAttentionName}) {
      const KernelDesc* kf = find(all, loom::ops::kAttentionFwd, name);
      const KernelDesc* kb = find(all, loom::ops::kAttentionBwd, name);
      if (kf == nullptr || kb == nullptr) die(std::string("no kernel ") + name);
      Call fwd(kf, {q.v, k.v, v.v, none}, {o.v, lse.v}, &at);
      Call bwd(kb, {dout.v, q.v, k.v, v.v, o.v, lse.v, none}, {dq.v, dk.v, dv.v}, &at);
      const auto before = loom::kernels::cuda::cudnn_attention_counters();
      const double fwd_ms = time_ms(iterations, [&] { fwd.run(); });
      const double both_ms = time_ms(iterations, [&] {
        fwd.run();
        bwd.run();
      });
      check(cudaDeviceSynchronize(), name);
      const auto after = loom::kernels::cuda::cudnn_attention_counters();
      std::string note = "loom's own kernel";
      if (std::strcmp(name, "cuda") != 0)
        note = after.fallback_calls > before.fallback_calls
                   ? "fell back to loom's kernel: " + after.last_decline
                   : "cuDNN ran every call";
      const double f_fwd = fwd.flops(), f_both = f_fwd + bwd.flops();
      std::printf("| %lld, %lld, %lld, %lld | %s | %.3f | %.1f | %.3f | %.1f | %s |\n",
                  static_cast<long long>(s.b), static_cast<long long>(s.t),
                  static_cast<long long>(s.h), static_cast<long long>(s.d), name, fwd_ms,
                  f_fwd / (fwd_ms * 1e9), both_ms, f_both / (both_ms * 1e9), note.c_str());
    }
  }
  return 0;
}
