// norm_bench: the CUDA norm kernels and the residual add fused into them, timed by CUDA events
// on the shapes of BENCHMARKS.md: GPT-2 124M's layernorm (B * T = 32768 rows of C = 768) and
// the 1.3B LLaMA-style model's rmsnorm (8192 rows of 2048), bf16. For each shape and pass it
// times the plain norm, the unfused pair a layer ran before the fusion (add then the norm;
// the norm's backward then add, two launches), and the fused op (add_layernorm_* /
// add_rmsnorm_*, one launch where norm.cuh's warp-per-row kernels take the row: C <= 2048;
// the unfused pair inside the op otherwise). Prints a Markdown
// table: milliseconds per call and the ideal bytes of the kernels' cost functions per second.
//
//   norm_bench [--iterations N]
//
// Without a GPU it prints "norm_bench: no CUDA device (...)" and exits 1, as gemm_bench.
#include <cuda_runtime.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <algorithm>
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
using loom::bench::time_ms;

// The CUDA kernel of `op` keyed bf16.
const KernelDesc& find(const std::vector<KernelDesc>& all, const char* op) {
  return loom::bench::find_kernel(all, op, DType::kBF16);
}
using Call = loom::bench::KernelCall;

struct Shape {
  const char* model;
  bool rms;
  int64_t n, c;
};

void row(const Shape& s, const char* pass, const char* variant, std::vector<Call*> calls,
         int iterations) {
  const double ms = time_ms(iterations, [&] {
    for (Call* c : calls) c->run();
  });
  double bytes = 0;
  for (Call* c : calls) bytes += c->bytes();
  std::printf("| %s %s (%lld, %lld) | %s | %s | %zu | %.4f | %.0f |\n", s.model,
              s.rms ? "rmsnorm" : "layernorm", static_cast<long long>(s.n),
              static_cast<long long>(s.c), pass, variant, calls.size(), ms, bytes / (ms * 1e6));
}

}  // namespace

int main(int argc, char** argv) {
  loom::bench::tool_name = "norm_bench";
  const int iterations = loom::bench::parse_iterations(argc, argv, 50);
  const cudaDeviceProp prop = loom::bench::require_device();
  std::vector<KernelDesc> all;
  loom::kernels::cuda::add_all_kernels(all);
  std::printf(
      "norm_bench: %s (sm_%d%d), bf16, %d iterations; GB/s = the kernels' ideal bytes "
      "(cost functions) per second\n\n",
      prop.name, prop.major, prop.minor, iterations);
  std::printf("| norm (rows, C) | pass | variant | launches | ms | GB/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  const std::vector<Shape> shapes = {{"GPT-2 124M", false, 32768, 768},
                                     {"LLaMA 1.3B", true, 8192, 2048}};
  namespace ops = loom::ops;
  const ops::NormAttrs at{1e-5f, 0};
  const auto sz = sizeof(at);
  for (const Shape& s : shapes) {
    const DType b = DType::kBF16, f = DType::kF32;
    DeviceTensor x(b, {s.n, s.c}, 1), r(b, {s.n, s.c}, 2), w(b, {s.c}, 3), bias(b, {s.c}, 4),
        y(b, {s.n, s.c}, 5), z(b, {s.n, s.c}, 6), mean(f, {s.n}, 0), rstd(f, {s.n}, 0),
        dy(b, {s.n, s.c}, 7), dz(b, {s.n, s.c}, 8), dx(b, {s.n, s.c}, 9), dw(f, {s.c}, 0),
        db(f, {s.c}, 0);
    const KernelDesc& add = find(all, ops::kAdd);
    Call add_fwd(add, {x.v, r.v}, {z.v}, nullptr, 0);
    Call add_bwd(add, {dx.v, dz.v}, {dx.v}, nullptr, 0);
    if (s.rms) {
      Call fwd(find(all, ops::kRmsNormFwd), {z.v, w.v}, {y.v, rstd.v}, &at, sz);
      Call fused_fwd(find(all, ops::kAddRmsNormFwd), {x.v, r.v, w.v}, {y.v, z.v, rstd.v}, &at, sz);
      Call bwd(find(all, ops::kRmsNormBwd), {dy.v, z.v, w.v, rstd.v}, {dx.v, dw.v}, &at, sz);
      Call fused_bwd(find(all, ops::kAddRmsNormBwd), {dy.v, z.v, w.v, rstd.v, dz.v}, {dx.v, dw.v},
                     &at, sz);
      row(s, "forward", "norm", {&fwd}, iterations);
      row(s, "forward", "add, norm", {&add_fwd, &fwd}, iterations);
      row(s, "forward", "add_rmsnorm_fwd", {&fused_fwd}, iterations);
      row(s, "backward", "norm", {&bwd}, iterations);
      row(s, "backward", "norm, add", {&bwd, &add_bwd}, iterations);
      row(s, "backward", "add_rmsnorm_bwd", {&fused_bwd}, iterations);
    } else {
      Call fwd(find(all, ops::kLayerNormFwd), {z.v, w.v, bias.v}, {y.v, mean.v, rstd.v}, &at, sz);
      Call fused_fwd(find(all, ops::kAddLayerNormFwd), {x.v, r.v, w.v, bias.v},
                     {y.v, z.v, mean.v, rstd.v}, &at, sz);
      Call bwd(find(all, ops::kLayerNormBwd), {dy.v, z.v, w.v, mean.v, rstd.v}, {dx.v, dw.v, db.v},
               &at, sz);
      Call fused_bwd(find(all, ops::kAddLayerNormBwd), {dy.v, z.v, w.v, mean.v, rstd.v, dz.v},
                     {dx.v, dw.v, db.v}, &at, sz);
      row(s, "forward", "norm", {&fwd}, iterations);
      row(s, "forward", "add, norm", {&add_fwd, &fwd}, iterations);
      row(s, "forward", "add_layernorm_fwd", {&fused_fwd}, iterations);
      row(s, "backward", "norm", {&bwd}, iterations);
      row(s, "backward", "norm, add", {&bwd, &add_bwd}, iterations);
      row(s, "backward", "add_layernorm_bwd", {&fused_bwd}, iterations);
    }
    check(cudaDeviceSynchronize(), "norm kernels");
  }
  return 0;
}
