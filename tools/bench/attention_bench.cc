// attention_bench: attention_fwd and attention_fwd + attention_bwd, bf16, causal, timed by
// CUDA events for each CUDA attention kernel: loom's own ("cuda") and cuDNN's ("cuda.cudnn",
// kernels/cuda/attention/cudnn_attention.h; the note column says whether cuDNN ran the calls
// or handed them back to loom's kernel, and why). Prints a Markdown table: milliseconds per
// call and TFLOP/s by loom's cost model (the kernels' cost functions: 4 * pairs * D forward,
// 8 * pairs * D backward, pairs = the visible (query, key) pairs).
//
//   attention_bench [--iterations N] [--kernel cuda|cuda.cudnn]
//
// The header line says which form of the causal mask cuDNN's graphs ask for when T == S
// (cudnn_attention.cc: top-left, or bottom-right with LOOM_CUDNN_CAUSAL=bottom_right; the
// same mask either way), so that two runs compare the forms.
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
#include "tools/bench/device_bench.h"

namespace {

using loom::DType;
using loom::KernelDesc;
using loom::TensorView;
using loom::bench::check;
using loom::bench::DeviceTensor;
using loom::bench::die;
using loom::bench::time_ms;

struct Shape {
  int64_t b, t, h, d;
};
// GPT-2 124M's attention at B = 32, T = 1024 and the 1.3B LLaMA-style model's at B = 4,
// T = 2048 (the shapes of BENCHMARKS.md).
const std::vector<Shape> kShapes = {{32, 1024, 12, 64}, {4, 2048, 16, 128}};

const KernelDesc* find(const std::vector<KernelDesc>& all, const char* op, const char* name) {
  for (const KernelDesc& k : all)
    if (std::strcmp(k.op, op) == 0 && std::strcmp(k.name, name) == 0 && k.dtype == DType::kBF16)
      return &k;
  return nullptr;
}

// One kernel's call with its own workspace; flops() by the kernel's cost model.
struct Call : loom::bench::KernelCall {
  Call(const KernelDesc* kd, std::vector<TensorView> i, std::vector<TensorView> o,
       const loom::ops::AttentionAttrs* at)
      : KernelCall(*kd, std::move(i), std::move(o), at, sizeof(*at)) {}
  double flops() { return cost().flops; }
};

}  // namespace

int main(int argc, char** argv) {
  loom::bench::tool_name = "attention_bench";
  // --kernel NAME (only that kernel's rows); the rest goes to parse_iterations.
  std::string only;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kernel") == 0 && i + 1 < argc)
      only = argv[++i];
    else
      rest.push_back(argv[i]);
  }
  if (!only.empty() && only != "cuda" && only != loom::kernels::cuda::kCudnnAttentionName)
    die("--kernel " + only + ": use cuda or " + loom::kernels::cuda::kCudnnAttentionName);
  const int iterations =
      loom::bench::parse_iterations(static_cast<int>(rest.size()), rest.data(), 20);
  const char* form = std::getenv("LOOM_CUDNN_CAUSAL");
  const cudaDeviceProp prop = loom::bench::require_device();
  std::vector<KernelDesc> all;
  loom::kernels::cuda::add_attention_kernels(all);
  loom::kernels::cuda::add_cudnn_attention_kernels(all);
  std::printf(
      "attention_bench: %s (sm_%d%d), cuDNN %lld, bf16, causal (cuDNN's graphs: %s for T == S), "
      "%d iterations\n\n",
      prop.name, prop.major, prop.minor,
      static_cast<long long>(loom::kernels::cuda::cudnn_runtime_version()),
      form != nullptr && std::strcmp(form, "bottom_right") == 0 ? "bottom-right" : "top-left",
      iterations);
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
      if (!only.empty() && only != name) continue;
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
