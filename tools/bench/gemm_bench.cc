// gemm_bench: loom's CUDA gemm kernel (cuBLASLt) against cuBLAS's own cublasGemmEx on the
// GEMM shapes of the benchmark models, bf16 operands with f32 accumulation unless asked
// otherwise; prints a Markdown table (or JSON lines) with TFLOP/s and the ratio. Issue
// target: loom within 10% of cuBLAS on every shape. Run by tools/gpu_check.
//
//   gemm_bench [--markdown | --json] [--dtype bf16|f16|f32] [--iterations N]
//              [--form fwd|dgrad|wgrad] [--candidates N] [--kernel cuda|tf32|tf32x3]
//              [--shape M,N,K]...
//
// --kernel (f32 only): tf32 times loom's "cuda.tf32" against cuBLAS's FAST_TF32 compute;
// tf32x3 times loom's "cuda.tf32x3" (f32 accuracy from three TF32 products) against cuBLAS's
// f32 compute, the GEMM it would replace. The default, cuda, is f32 against f32.
//
// --candidates N: also times the first N algorithms of cuBLASLt's heuristic list for each
// shape (loom's plan takes the first) and prints the fastest, its place in the list and its
// speed over loom's: what a measured choice of algorithm could gain.
//
// --form: which of a Linear's three GEMMs, each as the training step calls it:
//   fwd    Y (tokens, out) = X (tokens, in) @ W^T, W stored (out, in) (the default);
//   dgrad  dX (tokens, in) = dY (tokens, out) @ W, W stored (out, in);
//   wgrad  dW (out, in) += dY^T @ X, dY stored (tokens, out), X (tokens, in), dW f32, beta 1
//          (the weight gradient accumulated in f32).
// The model shapes below are given as (tokens, out, in) and become (M, N, K) of the form:
// fwd (tokens, out, in), dgrad (tokens, in, out), wgrad (out, in, tokens). A --shape is taken
// as the form's own M, N, K.
#include "kernels/cuda/lab/gemm_bench.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Shape {
  const char* what;
  int64_t m, n, k;
  bool trans_b;
};

// (tokens, out, in) of the forward Linears (weights stored (out, in): trans_b) of GPT-2 124M
// at B*T = 32 * 1024 and of the 1.3B LLaMA-style model at B*T = 4 * 2048, and two squares.
const std::vector<Shape> kShapes = {
    {"gpt2 qkv", 32768, 2304, 768, true},      {"gpt2 proj", 32768, 768, 768, true},
    {"gpt2 fc1", 32768, 3072, 768, true},      {"gpt2 fc2", 32768, 768, 3072, true},
    {"gpt2 lm head", 32768, 50304, 768, true}, {"llama qkv", 8192, 6144, 2048, true},
    {"llama proj", 8192, 2048, 2048, true},    {"llama fc1", 8192, 11264, 2048, true},
    {"llama fc2", 8192, 2048, 5632, true},     {"llama lm head", 8192, 32000, 2048, true},
    {"square 4096", 4096, 4096, 4096, false},  {"square 8192", 8192, 8192, 8192, false},
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "gemm_bench: %s\nusage: gemm_bench [--markdown | --json] [--dtype bf16|f16|f32] "
               "[--iterations N] [--form fwd|dgrad|wgrad] [--candidates N] "
               "[--kernel cuda|tf32|tf32x3] [--shape M,N,K]...\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  loom::DType dtype = loom::DType::kBF16;
  loom::kernels::cuda::GemmBenchOptions options;
  std::vector<Shape> shapes;
  std::vector<std::string> names;
  std::string form = "fwd";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--json") {
      json = true;
    } else if (a == "--markdown") {
      json = false;
    } else if (a == "--dtype") {
      std::string d = value();
      dtype = loom::dtype_from_name(d.c_str());
      if (dtype != loom::DType::kBF16 && dtype != loom::DType::kF16 && dtype != loom::DType::kF32)
        usage(("--dtype: '" + d + "' is not bf16, f16 or f32").c_str());
    } else if (a == "--iterations") {
      options.iterations = std::atoi(value().c_str());
      if (options.iterations < 1) usage("--iterations: expected an integer >= 1");
    } else if (a == "--candidates") {
      options.candidates = std::atoi(value().c_str());
      if (options.candidates < 1) usage("--candidates: expected an integer >= 1");
    } else if (a == "--kernel") {
      const std::string k = value();
      if (k != "cuda" && k != "tf32" && k != "tf32x3")
        usage(("--kernel: '" + k + "' is not cuda, tf32 or tf32x3").c_str());
      options.tf32 = k == "tf32";
      options.tf32x3 = k == "tf32x3";
    } else if (a == "--form") {
      form = value();
      if (form != "fwd" && form != "dgrad" && form != "wgrad")
        usage(("--form: '" + form + "' is not fwd, dgrad or wgrad").c_str());
    } else if (a == "--shape") {
      std::string v = value();
      long long m = 0, n = 0, k = 0;
      if (std::sscanf(v.c_str(), "%lld,%lld,%lld", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 1)
        usage(("--shape: '" + v + "' is not M,N,K with each >= 1").c_str());
      names.push_back("M,N,K = " + v);
      shapes.push_back({nullptr, m, n, k, true});
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (shapes.empty()) {
    for (const Shape& s : kShapes) {  // (tokens, out, in) -> the form's (M, N, K)
      if (form == "dgrad" && s.trans_b)
        shapes.push_back({s.what, s.m, s.k, s.n, false});
      else if (form == "wgrad" && s.trans_b)
        shapes.push_back({s.what, s.n, s.k, s.m, false});
      else if (form == "fwd")
        shapes.push_back(s);
    }
  }
  // The form's operand layouts (gemm_bench.h): dgrad and wgrad read B as stored (K, N);
  // wgrad reads A as stored (K, M) and accumulates into an f32 Y.
  if ((options.tf32 || options.tf32x3) && dtype != loom::DType::kF32)
    usage("--kernel tf32 and tf32x3 time f32 operands: add --dtype f32");
  options.trans_a = form == "wgrad";
  if (form == "wgrad") {
    options.y_dtype = loom::DType::kF32;
    options.beta = 1.0f;
  }
  if (!json) std::printf("form %s, %s operands\n\n", form.c_str(), loom::dtype_name(dtype));
  const bool cand = options.candidates > 0;
  if (!json)
    std::printf(
        "| shape | M | N | K | loom TFLOP/s | cuBLAS TFLOP/s | loom / cuBLAS |%s\n"
        "|---|---|---|---|---|---|---|%s\n",
        cand ? " best of cuBLASLt's list TFLOP/s (rank of N) | best / loom |" : "",
        cand ? "---|---|" : "");
  int failures = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    std::string what = s.what != nullptr ? s.what : names[i];
    options.trans_b = form == "fwd" && s.trans_b;
    auto r = loom::kernels::cuda::gemm_bench(s.m, s.n, s.k, dtype, options);
    if (!r.error.empty()) {
      std::fprintf(stderr, "gemm_bench: %s (%lld, %lld, %lld): %s\n", what.c_str(),
                   static_cast<long long>(s.m), static_cast<long long>(s.n),
                   static_cast<long long>(s.k), r.error.c_str());
      ++failures;
      continue;
    }
    double ratio = r.cublas_tflops > 0 ? r.loom_tflops / r.cublas_tflops : 0;
    const double gain = r.loom_tflops > 0 ? r.best_tflops / r.loom_tflops : 0;
    std::string extra;
    if (cand) {
      char buf[160];
      if (json)
        std::snprintf(buf, sizeof buf,
                      ", \"candidates\": %d, \"best_rank\": %d, \"best_tflops\": %.2f",
                      r.candidates, r.best_rank, r.best_tflops);
      else if (r.best_rank < 0)
        std::snprintf(buf, sizeof buf, " none of %d ran | - |", r.candidates);
      else
        std::snprintf(buf, sizeof buf, " %.1f (%d of %d) | %.3f |", r.best_tflops, r.best_rank,
                      r.candidates, gain);
      extra = buf;
    }
    if (json)
      std::printf(
          "{\"shape\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"dtype\": \"%s\", "
          "\"loom_tflops\": %.2f, \"cublas_tflops\": %.2f, \"ratio\": %.3f%s}\n",
          what.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
          static_cast<long long>(s.k), loom::dtype_name(dtype), r.loom_tflops, r.cublas_tflops,
          ratio, extra.c_str());
    else
      std::printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.3f |%s\n", what.c_str(),
                  static_cast<long long>(s.m), static_cast<long long>(s.n),
                  static_cast<long long>(s.k), r.loom_tflops, r.cublas_tflops, ratio,
                  extra.c_str());
  }
  return failures == 0 ? 0 : 1;
}
