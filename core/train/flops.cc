#include "core/train/flops.h"

#include <chrono>
#include <vector>

#include "loom/cpp/tensor.h"

namespace loom::core {

double measure_gemm_peak(IHost& host) {
  static double peak = 0;
  if (peak > 0) return peak;
  constexpr int64_t M = 1024, K = 768, N = 3072;
  std::vector<float> a(M * K, 0.01f), b(K * N, 0.02f), y(M * N);
  Kernel gemm(host, ops::kGemm, kCpu, DType::kF32);
  TensorView va = make_view(a.data(), DType::kF32, {M, K});
  TensorView vb = make_view(b.data(), DType::kF32, {K, N});
  TensorView vy = make_view(y.data(), DType::kF32, {M, N});
  ops::GemmAttrs attrs{0, 0, 1.f, 0.f};
  gemm({va, vb}, {vy}, attrs);  // warm-up: threads, caches, page faults
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    gemm({va, vb}, {vy}, attrs);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  peak = 2.0 * M * K * N / best;
  return peak;
}

}  // namespace loom::core
