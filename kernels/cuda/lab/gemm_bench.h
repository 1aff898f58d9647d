// Timing of loom's CUDA gemm kernel against cuBLAS on the same problem, and of its fp8_gemm
// kernel, for the benchmark tool (tools/bench:gemm_bench) and BENCHMARKS.md (DESIGN.md
// section 10: GEMM within 10% of cuBLAS on the same shapes). Lab code: not part of the
// kernels_cuda plugin. Plain C++: no CUDA types.
#pragma once

#include <loom/types.h>
#include <stdint.h>

#include <string>

namespace loom::kernels::cuda {

/// What to time besides (M, N, K) and the operands' dtype.
struct GemmBenchOptions {
  bool trans_a = false;             ///< A stored (K, M) instead of (M, K)
  bool trans_b = true;              ///< B stored (N, K), as a Linear's weight (out, in) is
  DType y_dtype = DType::kInvalid;  ///< Y's dtype: the operands' (kInvalid) or f32
  bool tf32 = false;  ///< f32 operands: loom's "cuda.tf32" and cuBLAS's FAST_TF32 compute
  /// f32 operands: loom's "cuda.tf32x3" (three TF32 products, f32 accuracy; with the workspace
  /// its KernelDesc declares, as loom::Kernel gives it) against cuBLAS's f32 compute, the
  /// kernel it stands in for.
  bool tf32x3 = false;
  float beta = 0.0f;     ///< 1 times the accumulating form (weight gradients)
  bool cublas = true;    ///< also time cublasGemmEx (false: loom's kernel alone, cublas_* 0)
  int warmup = 10;       ///< untimed calls of each before timing (plans, clocks)
  int iterations = 100;  ///< timed calls of each, back to back on one stream
  int device = 0;        ///< CUDA device ordinal
  /// Also time the first `candidates` algorithms of cuBLASLt's heuristic list for the problem
  /// (its ranking, best first; loom's plan takes the first): how much a measured choice could
  /// gain over the heuristic's. 0: not timed.
  int candidates = 0;
};

/// Times of one problem; TFLOP/s count 2 M N K floating-point operations per call.
struct GemmBenchResult {
  double loom_ms = 0.0;        ///< mean time of one call of loom's gemm (or fp8_gemm) kernel
  double cublas_ms =
      0.0;  ///< mean time of one cublasGemmEx call (0 from fp8_gemm_bench or !cublas)
  double loom_tflops = 0.0;    ///< 2 M N K / loom_ms, in 10^12 per second
  double cublas_tflops = 0.0;  ///< 2 M N K / cublas_ms (0 likewise)
  int candidates = 0;          ///< heuristic algorithms timed (options.candidates or fewer)
  int best_rank = -1;          ///< the fastest one's place in the heuristic's list (0: first)
  double best_ms = 0.0;        ///< its mean time of one call
  double best_tflops = 0.0;    ///< 2 M N K / best_ms
  std::string error;           ///< why nothing was measured; empty on success
};

/// Allocates A, B and Y on `options.device` for Y (M, N) = op(A) @ op(B) with inner
/// dimension K, fills A and B with uniform values in [-1, 1) (and Y with 0), times
/// `options.iterations` calls of loom's gemm kernel (through its KernelFn, as a module calls
/// it) and (options.cublas) of cublasGemmEx with CUBLAS_COMPUTE_32F (or FAST_TF32) on the
/// same buffers with CUDA events, and frees everything. Never throws; a failure is reported
/// in `error`.
/// \param m, n, k  problem size, each in [1, 2^31)
/// \param dtype    operands' dtype: f32, bf16 or f16
GemmBenchResult gemm_bench(int64_t m, int64_t n, int64_t k, DType dtype,
                           const GemmBenchOptions& options = {});

/// What fp8_gemm_bench times besides (M, N, K): one call of fp8_gemm (loom/ops/fp8.h),
/// Y (M, N) = alpha * A (M, K) @ B (N, K)^T + beta * Y with both scale_invs 1.
struct Fp8GemmBenchOptions {
  DType a_dtype = DType::kF8E4M3;  ///< A's dtype: fp8_e4m3 or fp8_e5m2
  DType b_dtype = DType::kF8E4M3;  ///< B's dtype: fp8_e4m3 or fp8_e5m2 (not both e5m2)
  DType y_dtype = DType::kBF16;    ///< Y's dtype: f32, bf16 or f16
  bool fast_accum = true;          ///< Fp8GemmAttrs::fast_accum
  float beta = 0.0f;               ///< 1 times the accumulating form (weight gradients)
  int warmup = 10;                 ///< untimed calls before timing (plans, clocks)
  int iterations = 100;            ///< timed calls, back to back on one stream
  int device = 0;                  ///< CUDA device ordinal
  /// Also time the first `candidates` algorithms of cuBLASLt's heuristic list for the FP8
  /// problem, as GemmBenchOptions::candidates. 0: not timed.
  int candidates = 0;
};

/// Allocates A, B, Y and the two scale_invs on `options.device`, fills A and B with the
/// codes of uniform values in [-1, 1) (and Y with 0), times `options.iterations` calls of
/// loom's fp8_gemm kernel (through its KernelFn, as nn::Linear calls it) with CUDA events, and
/// frees everything. The result's loom_* fields hold the times (cublas_* stay 0: cuBLAS has
/// no FP8 GEMM outside cuBLASLt). Never throws; a failure (a GPU before sm_89, a shape
/// cuBLASLt's FP8 kernels do not take) is reported in `error`.
/// \param m, n, k  problem size, each in [1, 2^31); K a multiple of 16 (cuBLASLt's FP8)
GemmBenchResult fp8_gemm_bench(int64_t m, int64_t n, int64_t k,
                               const Fp8GemmBenchOptions& options = {});

}  // namespace loom::kernels::cuda
