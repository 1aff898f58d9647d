// gemm_bench: loom's CUDA gemm kernel (cuBLASLt) against cuBLAS's own cublasGemmEx on the
// GEMM shapes of the benchmark models, bf16 operands with f32 accumulation unless asked
// otherwise; prints a Markdown table (or JSON lines) with TFLOP/s and the ratio. Issue
// target: loom within 10% of cuBLAS on every shape. Run by tools/gpu_check.
//
//   gemm_bench [--markdown | --json] [--dtype bf16|f16|f32|fp8] [--iterations N]
//              [--form fwd|dgrad|wgrad] [--candidates N] [--kernel cuda|tf32|tf32x3]
//              [--fast-accum 0|1] [--only NAME] [--shape M,N,K]...
//
// --only NAME keeps the default shapes whose name starts with NAME ("llama", "gpt2",
// "square").
//
// --dtype fp8 times loom's fp8_gemm as an FP8 Linear of the "hybrid" format calls it (E4M3
// activations and weights, E5M2 gradients; nn::Linear) against loom's bf16 gemm on the same
// form and shape, the GEMM it replaces: its "fp8 / bf16" column is the speed-up FP8 gives
// that GEMM. fwd: Y bf16 = X (E4M3) @ W^T (E4M3), fast accumulation; dgrad: dX bf16 = dY
// (E5M2) @ W, from W^T (E4M3) stored (in, out); wgrad: dW f32 += dY^T (E5M2) @ X^T (E4M3),
// both stored token-contiguous. dgrad and wgrad promote their sums to f32 (fast_accum 0), as
// Transformer Engine's default; --fast-accum 0|1 overrides the form's choice.
//
// --kernel (f32 only): tf32 times loom's "cuda.tf32" against cuBLAS's FAST_TF32 compute;
// tf32x3 times loom's "cuda.tf32x3" (f32 accuracy from three TF32 products) against cuBLAS's
// f32 compute, the GEMM it would replace. The default, cuda, is f32 against f32.
//
// --candidates N: also times the first N algorithms of cuBLASLt's heuristic list for each
// shape (loom's plan takes the first) and prints the fastest, its place in the list and its
// speed over loom's: what a measured choice of algorithm could gain.
//
// With the default shapes the table ends with the LLaMA 1.3B layers' four shapes summed
// over 24 layers: the step's GEMM time in that form outside the output layer.
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
               "gemm_bench: %s\nusage: gemm_bench [--markdown | --json] "
               "[--dtype bf16|f16|f32|fp8] [--iterations N] [--form fwd|dgrad|wgrad] "
               "[--candidates N] [--kernel cuda|tf32|tf32x3] [--fast-accum 0|1] "
               "[--only NAME] [--shape M,N,K]...\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool fp8 = false;
  int fast_accum = -1;  // the form's choice
  loom::DType dtype = loom::DType::kBF16;
  loom::kernels::cuda::GemmBenchOptions options;
  std::vector<Shape> shapes;
  std::vector<std::string> names;
  std::string form = "fwd";
  std::string only;  // --only: the default shapes whose name starts with it
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
      fp8 = d == "fp8";
      dtype = fp8 ? loom::DType::kBF16 : loom::dtype_from_name(d.c_str());
      if (dtype != loom::DType::kBF16 && dtype != loom::DType::kF16 && dtype != loom::DType::kF32)
        usage(("--dtype: '" + d + "' is not bf16, f16, f32 or fp8").c_str());
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
    } else if (a == "--fast-accum") {
      const std::string f = value();
      if (f != "0" && f != "1") usage(("--fast-accum: '" + f + "' is not 0 or 1").c_str());
      fast_accum = f == "1";
    } else if (a == "--form") {
      form = value();
      if (form != "fwd" && form != "dgrad" && form != "wgrad")
        usage(("--form: '" + form + "' is not fwd, dgrad or wgrad").c_str());
    } else if (a == "--only") {
      only = value();
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
  if (!only.empty() && !shapes.empty()) usage("--only picks default shapes: not with --shape");
  if (shapes.empty()) {
    for (const Shape& s : kShapes) {  // (tokens, out, in) -> the form's (M, N, K)
      if (std::strncmp(s.what, only.c_str(), only.size()) != 0) continue;
      if (form == "dgrad" && s.trans_b)
        shapes.push_back({s.what, s.m, s.k, s.n, false});
      else if (form == "wgrad" && s.trans_b)
        shapes.push_back({s.what, s.n, s.k, s.m, false});
      else if (form == "fwd")
        shapes.push_back(s);
    }
    if (shapes.empty())
      usage(("--only '" + only + "': no default shape of form " + form +
             " has a name that starts so (llama, gpt2, square)")
                .c_str());
  }
  // The form's operand layouts (gemm_bench.h): dgrad and wgrad read B as stored (K, N);
  // wgrad reads A as stored (K, M) and accumulates into an f32 Y.
  if ((options.tf32 || options.tf32x3) && fp8) usage("--kernel tf32 and tf32x3 are not fp8");
  if ((options.tf32 || options.tf32x3) && dtype != loom::DType::kF32)
    usage("--kernel tf32 and tf32x3 time f32 operands: add --dtype f32");
  if (fast_accum >= 0 && !fp8) usage("--fast-accum is fp8_gemm's: add --dtype fp8");
  options.trans_a = form == "wgrad";
  if (form == "wgrad") {
    options.y_dtype = loom::DType::kF32;
    options.beta = 1.0f;
  }
  // The FP8 form, as nn::Linear calls fp8_gemm (the file comment).
  loom::kernels::cuda::Fp8GemmBenchOptions fp8_options;
  fp8_options.iterations = options.iterations;
  fp8_options.candidates = options.candidates;
  fp8_options.a_dtype = form == "fwd" ? loom::DType::kF8E4M3 : loom::DType::kF8E5M2;
  fp8_options.y_dtype = form == "wgrad" ? loom::DType::kF32 : loom::DType::kBF16;
  fp8_options.beta = options.beta;
  fp8_options.fast_accum = fast_accum >= 0 ? fast_accum == 1 : form == "fwd";
  if (fp8) {  // the bf16 column is loom's kernel alone, the baseline
    options.candidates = 0;
    options.cublas = false;
  }
  if (!json && fp8)
    std::printf("form %s, fp8_gemm (A %s, B fp8_e4m3, Y %s, fast_accum %d) against bf16 gemm\n\n",
                form.c_str(), loom::dtype_name(fp8_options.a_dtype),
                loom::dtype_name(fp8_options.y_dtype), fp8_options.fast_accum ? 1 : 0);
  else if (!json)
    std::printf("form %s, %s operands\n\n", form.c_str(), loom::dtype_name(dtype));
  const bool cand = (fp8 ? fp8_options.candidates : options.candidates) > 0;
  if (!json)
    std::printf(
        "| shape | M | N | K | %s TFLOP/s | %s TFLOP/s | %s |%s\n"
        "|---|---|---|---|---|---|---|%s\n",
        fp8 ? "fp8" : "loom", fp8 ? "bf16" : "cuBLAS", fp8 ? "fp8 / bf16" : "loom / cuBLAS",
        cand ? " best of cuBLASLt's list TFLOP/s (rank of N) | best / loom |" : "",
        cand ? "---|---|" : "");
  double layers_ms = 0.0, layers_base_ms = 0.0;  // the LLaMA layers' shapes, one layer
  int layers_shapes = 0;
  int failures = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    std::string what = s.what != nullptr ? s.what : names[i];
    options.trans_b = form == "fwd" && s.trans_b;
    auto r = loom::kernels::cuda::gemm_bench(s.m, s.n, s.k, dtype, options);
    if (fp8 && r.error.empty()) {  // the fp8 GEMM in loom's columns, bf16 in the baseline's
      auto q = loom::kernels::cuda::fp8_gemm_bench(s.m, s.n, s.k, fp8_options);
      q.cublas_ms = r.loom_ms;
      q.cublas_tflops = r.loom_tflops;
      r = q;
    }
    if (!r.error.empty()) {
      std::fprintf(stderr, "gemm_bench: %s (%lld, %lld, %lld): %s\n", what.c_str(),
                   static_cast<long long>(s.m), static_cast<long long>(s.n),
                   static_cast<long long>(s.k), r.error.c_str());
      ++failures;
      continue;
    }
    if (s.what != nullptr && std::strncmp(s.what, "llama ", 6) == 0 &&
        std::strcmp(s.what, "llama lm head") != 0) {
      layers_ms += r.loom_ms;
      layers_base_ms += r.cublas_ms;
      ++layers_shapes;
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
          "\"%s_tflops\": %.2f, \"%s_tflops\": %.2f, \"ratio\": %.3f%s}\n",
          what.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
          static_cast<long long>(s.k), fp8 ? "fp8" : loom::dtype_name(dtype), fp8 ? "fp8" : "loom",
          r.loom_tflops, fp8 ? "bf16" : "cublas", r.cublas_tflops, ratio, extra.c_str());
    else
      std::printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.3f |%s\n", what.c_str(),
                  static_cast<long long>(s.m), static_cast<long long>(s.n),
                  static_cast<long long>(s.k), r.loom_tflops, r.cublas_tflops, ratio,
                  extra.c_str());
  }
  if (!json && layers_shapes == 4)  // every LLaMA layer shape ran
    std::printf(
        "\nLLaMA 1.3B's 24 layers (qkv, proj, fc1, fc2), form %s: %s %.2f ms, %s %.2f ms "
        "a step\n",
        form.c_str(), fp8 ? "fp8" : "loom", 24 * layers_ms, fp8 ? "bf16" : "cuBLAS",
        24 * layers_base_ms);
  return failures == 0 ? 0 : 1;
}
