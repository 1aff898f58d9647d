#include "core/train/flops.h"

#include <chrono>
#include <vector>

#include "loom/cpp/tensor.h"

namespace loom::core {

double model_flops_per_token(int64_t num_params, const nlohmann::json& model, int64_t seq_length) {
  double flops = 6.0 * static_cast<double>(num_params);
  auto number = [&](const char* key) {
    return model.is_object() && model.contains(key) && model[key].is_number();
  };
  if (number("num_layers") && number("hidden_size")) {
    double layers = model["num_layers"].get<double>();
    double width = model["hidden_size"].get<double>();
    if (number("kv_channels") && number("num_attention_heads"))
      width = model["kv_channels"].get<double>() * model["num_attention_heads"].get<double>();
    flops += 6.0 * layers * static_cast<double>(seq_length) * width;
  }
  return flops;
}

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
