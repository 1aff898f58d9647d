// optim_bench: the CUDA adamw_step_multi kernel over the parameters of the 1.3B LLaMA-style
// model of BENCHMARKS.md (configs/gpu/llama_1b3_h100.json: 24 layers of hidden 2048, FFN 5632,
// 16 heads, vocabulary 32000 untied; 219 tensors, 1.35B parameters), one call a step as the
// trainer makes it: f32 gradients and masters, bf16 parameters written, and the moments in f32
// or in bf16 (Megatron's precision-aware optimizer, /optimizer/exp_avg_dtype and
// exp_avg_sq_dtype). Timed by CUDA events; prints a Markdown table: milliseconds per step
// and the bytes the step must move per second: the gradient read, the master and both
// moments read and written, the parameter written (f32 moments 30 bytes a parameter, bf16
// ones 22; the op's cost function counts the read-and-written tensors once).
//
//   optim_bench [--iterations N]
//
// Without a GPU it prints "optim_bench: no CUDA device (...)" and exits 1, as gemm_bench.
#include <cuda_runtime.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/kernel_families.h"
#include "tools/bench/device_bench.h"

namespace {

using loom::DType;
using loom::TensorView;
using loom::bench::time_ms;

// The parameter tensors of the 1.3B LLaMA-style model: (elements, weight decay applies).
std::vector<std::pair<int64_t, bool>> llama_1b3_tensors() {
  const int64_t h = 2048, f = 5632, v = 32000, layers = 24;
  std::vector<std::pair<int64_t, bool>> t{{v * h, true}};  // embedding
  for (int64_t l = 0; l < layers; ++l) {
    t.push_back({h, false});         // input norm
    t.push_back({3 * h * h, true});  // qkv
    t.push_back({h * h, true});      // attention output
    t.push_back({h, false});         // MLP norm
    t.push_back({2 * f * h, true});  // fc1 (gate and up)
    t.push_back({f * h, true});      // fc2
  }
  t.push_back({h, false});     // final norm
  t.push_back({v * h, true});  // output layer
  return t;
}

// A zero-filled device tensor of n elements.
struct ZeroTensor {
  TensorView v{};
  ZeroTensor(DType dt, int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * loom::dtype_size(dt);
    void* data = nullptr;
    loom::bench::check(cudaMalloc(&data, bytes), "cudaMalloc");
    loom::bench::check(cudaMemset(data, 0, bytes), "cudaMemset");
    v = loom::make_view(data, dt, {n}, loom::Device{loom::DeviceType::kCuda, 0});
  }
  ~ZeroTensor() { cudaFree(v.data); }
  ZeroTensor(const ZeroTensor&) = delete;
  ZeroTensor& operator=(const ZeroTensor&) = delete;
};

}  // namespace

int main(int argc, char** argv) {
  loom::bench::tool_name = "optim_bench";
  const int iterations = loom::bench::parse_iterations(argc, argv, 20);
  const cudaDeviceProp prop = loom::bench::require_device();
  std::vector<loom::KernelDesc> all;
  loom::kernels::cuda::add_all_kernels(all);
  const loom::KernelDesc& multi =
      loom::bench::find_kernel(all, loom::ops::kAdamWStepMulti, DType::kF32);
  const auto tensors = llama_1b3_tensors();
  int64_t total = 0;
  for (const auto& t : tensors) total += t.first;
  std::printf(
      "optim_bench: %s (sm_%d%d), adamw_step_multi over LLaMA 1.3B's %zu tensors (%.3fB "
      "parameters), f32 gradients and masters, bf16 parameters written; %d iterations; GB/s "
      "= the bytes a step must move (gradient read; master and moments read and written; "
      "parameter written) per second\n\n",
      prop.name, prop.major, prop.minor, tensors.size(), static_cast<double>(total) / 1e9,
      iterations);
  std::printf("| moments | bytes / parameter | ms / step | GB/s |\n|---|---|---|---|\n");
  for (DType moment : {DType::kF32, DType::kBF16}) {
    // Zeros (cudaMemset) rather than DeviceTensor's host-drawn bf16 values: 4B elements drawn
    // on the host would take seconds of GPU time, and a bandwidth-bound step's speed does
    // not depend on the values (0 / (sqrt(0) + eps) is finite).
    std::vector<std::unique_ptr<ZeroTensor>> keep;
    std::vector<TensorView> grads, outs;
    std::vector<float> decay;
    for (const auto& [n, decays] : tensors) {
      auto make = [&](DType dt) {
        keep.push_back(std::make_unique<ZeroTensor>(dt, n));
        return keep.back()->v;
      };
      grads.push_back(make(DType::kF32));
      outs.push_back(make(DType::kF32));   // master
      outs.push_back(make(moment));        // exp_avg
      outs.push_back(make(moment));        // exp_avg_sq
      outs.push_back(make(DType::kBF16));  // param
      decay.push_back(decays ? 0.1f : 0.0f);
    }
    const loom::ops::AdamWMultiAttrs at{
        3e-4f, 0.9f, 0.95f, 1e-8f, 1.0f, static_cast<int32_t>(tensors.size()), 10, decay.data()};
    loom::bench::KernelCall call(multi, grads, outs, &at, sizeof(at));
    const double ms = time_ms(iterations, [&] { call.run(); });
    const double per_parameter =
        4.0 + 2 * 4.0 + 2 * 2 * static_cast<double>(dtype_size(moment)) + 2.0;
    const double bytes = per_parameter * static_cast<double>(total);
    std::printf("| %s | %.0f | %.3f | %.0f |\n", moment == DType::kF32 ? "f32" : "bf16",
                bytes / static_cast<double>(total), ms, bytes / (ms * 1e6));
  }
  return 0;
}
