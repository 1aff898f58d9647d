// fp8_quantize_bench: the CUDA fp8_quantize kernel on the calls of one training step of
// configs/gpu/llama_1b3_h100_fp8.json (B * T = 8192 tokens, hidden 2048, FFN 5632, 24 layers):
// X bf16 to Y and Yt with amax, E4M3 for the four GEMM inputs and the four weights of a layer,
// E5M2 for the four output gradients, timed by CUDA events. Prints a Markdown table: each
// shape's milliseconds per call and the ideal bytes of its cost function (X read, Y and Yt
// written) per second, then the step's total, 24 layers of every row. The step total is what
// an ncu profile of a step shows as quantize_transpose_kernel (BENCHMARKS.md).
// A second table times swiglu with its result quantised in one pass (swiglu_fp8_fwd,
// swiglu_fp8_bwd) against swiglu_fwd / swiglu_bwd into bf16 then fp8_quantize, at the MLP's
// shape (the step's "input of down" and "grad of gate_up" rows, which the fused ops replace),
// and a third rope_bwd on q and k then fp8_quantize against rope_fp8_bwd at the attention's
// (the "grad of qkv" row).
//
//   fp8_quantize_bench [--iterations N]
//   LOOM_FP8_QUANTIZE=general fp8_quantize_bench    the general transpose kernel
//
// Without a GPU it prints "fp8_quantize_bench: no CUDA device (...)" and exits 1, as gemm_bench.
#include <cuda_runtime.h>
#include <loom/cpp/nn/qkv_views.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/kernel_families.h"
#include "tools/bench/device_bench.h"

namespace {

using loom::DType;
using loom::KernelDesc;
using loom::TensorView;
using loom::bench::check;
using loom::bench::DeviceTensor;
using loom::bench::die;
using loom::bench::KernelCall;
using loom::bench::time_ms;

struct Row {
  const char* what;
  int64_t m, k;
  DType fp8;
};

}  // namespace

int main(int argc, char** argv) {
  loom::bench::tool_name = "fp8_quantize_bench";
  const int iterations = loom::bench::parse_iterations(argc, argv, 50);
  const cudaDeviceProp prop = loom::bench::require_device();
  std::vector<KernelDesc> all;
  loom::kernels::cuda::add_all_kernels(all);
  const KernelDesc& kernel = loom::bench::find_kernel(all, loom::ops::kFp8Quantize, DType::kBF16);
  const char* env = std::getenv("LOOM_FP8_QUANTIZE");
  const std::string variant = env != nullptr && *env != '\0' ? env : "typed";
  std::printf(
      "fp8_quantize_bench: %s (sm_%d%d), X bf16 -> Y, Yt and amax, kernel %s "
      "(LOOM_FP8_QUANTIZE), %d iterations; GB/s = the kernel's ideal bytes (cost function) per "
      "second\n\n",
      prop.name, prop.major, prop.minor, variant.c_str(), iterations);
  std::printf("| X of LLaMA 1.3B FP8 (M, K) | format | kernel | ms | GB/s |\n");
  std::printf("|---|---|---|---|---|\n");
  const DType e4 = DType::kF8E4M3, e5 = DType::kF8E5M2;
  const int64_t n = 8192, c = 2048, f = 5632;  // tokens, hidden, FFN
  const std::vector<Row> rows = {
      {"input of qkv, out proj, gate_up", n, c, e4},
      {"input of down", n, f, e4},
      {"weight qkv", 3 * c, c, e4},
      {"weight out proj", c, c, e4},
      {"weight gate_up", 2 * f, c, e4},
      {"weight down", c, f, e4},
      {"grad of qkv", n, 3 * c, e5},
      {"grad of out proj, down", n, c, e5},
      {"grad of gate_up", n, 2 * f, e5},
  };
  // Calls of each row in a layer: the first input feeds three GEMMs; dY of out proj and of down
  // have one shape.
  const int per_layer[] = {3, 1, 1, 1, 1, 1, 1, 2, 1};
  constexpr int kLayers = 24;
  double step_ms = 0, step_bytes = 0;
  const float one = 1.0f;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    DeviceTensor x(DType::kBF16, {row.m, row.k}, 11 + r), scale(DType::kF32, {1}, 0),
        y(row.fp8, {row.m, row.k}, 0), yt(row.fp8, {row.k, row.m}, 0), amax(DType::kF32, {1}, 0);
    check(cudaMemcpy(scale.v.data, &one, sizeof(one), cudaMemcpyHostToDevice), "cudaMemcpy");
    KernelCall call(kernel, {x.v, scale.v}, {y.v, yt.v, amax.v}, nullptr, 0);
    const double ms = time_ms(iterations, [&] { call.run(); });
    const double bytes = call.bytes();
    std::printf("| %s (%lld, %lld) | %s | %s | %.4f | %.0f |\n", row.what,
                static_cast<long long>(row.m), static_cast<long long>(row.k),
                row.fp8 == e4 ? "E4M3" : "E5M2", variant.c_str(), ms, bytes / (ms * 1e6));
    step_ms += kLayers * per_layer[r] * ms;
    step_bytes += kLayers * per_layer[r] * bytes;
    check(cudaDeviceSynchronize(), "fp8_quantize");
  }
  std::printf("| one step: 24 layers of the rows above (%d calls) | | %s | %.3f | %.0f |\n",
              kLayers * 12, variant.c_str(), step_ms, step_bytes / (step_ms * 1e6));

  // swiglu and the quantisation of its result: two kernels against one.
  std::printf(
      "\n| swiglu of LLaMA 1.3B FP8, X (%lld, %lld) bf16 | swiglu then fp8_quantize, ms | "
      "swiglu_fp8 in one pass, ms | one pass faster | a step (24 layers) saves, ms |\n",
      static_cast<long long>(n), static_cast<long long>(2 * f));
  std::printf("|---|---|---|---|---|\n");
  for (bool bwd : {false, true}) {
    const int64_t k = bwd ? 2 * f : f;
    const DType fp8 = bwd ? e5 : e4;
    DeviceTensor x(DType::kBF16, {n, 2 * f}, 31), dy(DType::kBF16, {n, f}, 32),
        mid(DType::kBF16, {n, k}, 0), scale(DType::kF32, {1}, 0), y(fp8, {n, k}, 0),
        yt(fp8, {k, n}, 0), amax(DType::kF32, {1}, 0);
    check(cudaMemcpy(scale.v.data, &one, sizeof(one), cudaMemcpyHostToDevice), "cudaMemcpy");
    const KernelDesc& act = loom::bench::find_kernel(
        all, bwd ? loom::ops::kSwigluBwd : loom::ops::kSwigluFwd, DType::kBF16);
    const KernelDesc& fused = loom::bench::find_kernel(
        all, bwd ? loom::ops::kSwigluFp8Bwd : loom::ops::kSwigluFp8Fwd, DType::kBF16);
    std::vector<TensorView> act_in =
        bwd ? std::vector<TensorView>{dy.v, x.v} : std::vector<TensorView>{x.v};
    std::vector<TensorView> fused_in =
        bwd ? std::vector<TensorView>{dy.v, x.v, scale.v} : std::vector<TensorView>{x.v, scale.v};
    KernelCall a(act, act_in, {mid.v}, nullptr, 0);
    KernelCall q(kernel, {mid.v, scale.v}, {y.v, yt.v, amax.v}, nullptr, 0);
    KernelCall one_pass(fused, fused_in, {y.v, yt.v, amax.v}, nullptr, 0);
    const double two_ms = time_ms(iterations, [&] {
      a.run();
      q.run();
    });
    const double one_ms = time_ms(iterations, [&] { one_pass.run(); });
    std::printf("| %s (%s) | %.4f | %.4f | %.2fx | %.3f |\n", bwd ? "backward" : "forward",
                bwd ? "E5M2, dX (N, 2F)" : "E4M3, Y (N, F)", two_ms, one_ms, two_ms / one_ms,
                kLayers * (two_ms - one_ms));
    check(cudaDeviceSynchronize(), "swiglu_fp8");
  }

  // rope's backward and the quantisation of the QKV gradient: three kernels (rope_bwd on the
  // q and k views, in place, then fp8_quantize) against one, at LLaMA 1.3B's MHA shape.
  const int64_t b = 4, t = n / b, heads = 16, d = c / heads;
  std::printf(
      "\n| rope backward of LLaMA 1.3B FP8, dQKV (%lld, %lld, %lld, %lld) bf16 -> E5M2 | "
      "rope_bwd on q and k then fp8_quantize, ms | rope_fp8_bwd in one pass, ms | one pass "
      "faster | a step (24 layers) saves, ms |\n",
      static_cast<long long>(b), static_cast<long long>(t), static_cast<long long>(heads),
      static_cast<long long>(3 * d));
  std::printf("|---|---|---|---|---|\n");
  {
    DeviceTensor dqkv(DType::kBF16, {b, t, heads, 3 * d}, 41), scale(DType::kF32, {1}, 0),
        y(e5, {n, 3 * c}, 0), yt(e5, {3 * c, n}, 0), amax(DType::kF32, {1}, 0),
        inv_freq(DType::kF32, {d / 2}, 42);
    check(cudaMemcpy(scale.v.data, &one, sizeof(one), cudaMemcpyHostToDevice), "cudaMemcpy");
    std::vector<float> freq(static_cast<size_t>(d / 2));  // Llama's, base 10000
    for (size_t i = 0; i < freq.size(); ++i)
      freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / d));
    check(cudaMemcpy(inv_freq.v.data, freq.data(), freq.size() * sizeof(float),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
    loom::nn::QkvViews views{};
    if (!loom::nn::fused_qkv_views(dqkv.v, &views)) die("fused_qkv_views declined");
    TensorView none{}, rows = dqkv.v;  // dQKV as the (B T, 3 C) matrix fp8_quantize reads
    rows.ndim = 2;
    rows.shape[0] = n;
    rows.shape[1] = 3 * c;
    rows.strides[0] = 3 * c;
    rows.strides[1] = 1;
    const loom::ops::RopeAttrs ra{static_cast<int32_t>(d)};
    const loom::ops::RopeFp8Attrs fa{static_cast<int32_t>(d), static_cast<int32_t>(d)};
    const KernelDesc& rope = loom::bench::find_kernel(all, loom::ops::kRopeBwd, DType::kBF16);
    const KernelDesc& fused = loom::bench::find_kernel(all, loom::ops::kRopeFp8Bwd, DType::kBF16);
    KernelCall rq(rope, {views.q, none, inv_freq.v}, {views.q}, &ra, sizeof(ra));
    KernelCall rk(rope, {views.k, none, inv_freq.v}, {views.k}, &ra, sizeof(ra));
    KernelCall q(kernel, {rows, scale.v}, {y.v, yt.v, amax.v}, nullptr, 0);
    KernelCall one_pass(fused, {dqkv.v, none, inv_freq.v, scale.v}, {y.v, yt.v, amax.v}, &fa,
                        sizeof(fa));
    const double three_ms = time_ms(iterations, [&] {
      rq.run();
      rk.run();
      q.run();
    });
    const double one_ms = time_ms(iterations, [&] { one_pass.run(); });
    std::printf("| backward (E5M2, dQKV (B T, 3 C)) | %.4f | %.4f | %.2fx | %.3f |\n", three_ms,
                one_ms, three_ms / one_ms, kLayers * (three_ms - one_ms));
    check(cudaDeviceSynchronize(), "rope_fp8_bwd");
  }
  return 0;
}
