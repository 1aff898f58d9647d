// gemm_bench (gemm_bench.h): loom's CUDA gemm kernel and cublasGemmEx timed on the same
// buffers, with CUDA events around `iterations` back-to-back calls on one stream, after
// `warmup` untimed calls (which also build loom's cached cuBLASLt plan); fp8_gemm_bench
// likewise for loom's fp8_gemm kernel alone.
#include <cublas_v2.h>
#include <cuda_fp8.h>
#include <loom/cpp/error.h>
#include <loom/cpp/fp8.h>
#include <loom/cpp/op_args.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/gemm/cublaslt.cuh"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/lab/gemm_bench.h"

namespace loom::kernels::cuda {
namespace {

// The benchmarks' stream on `device`, made once and kept: loom's GEMM keeps a workspace per
// (device, stream) for the life of the process (common/resources.cuh), so a stream per call
// would leave one behind each time.
cudaStream_t bench_stream(int device) {
  static std::mutex mutex;
  static auto* streams = new std::map<int, cudaStream_t>();  // leaked, as the workspaces
  std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t& stream = (*streams)[device];
  if (stream == nullptr) {
    cudaError_t status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (status != cudaSuccess) {
      streams->erase(device);
      cuda_check(status, "cudaStreamCreate");
    }
  }
  return stream;
}

// Owns device memory, events and a cuBLAS handle, so every early exit frees them.
struct Resources {
  void* a = nullptr;
  void* b = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;  // the candidates' (kScratchBytes)
  void* split = nullptr;      // cuda.tf32x3's
  void* scales = nullptr;     // fp8_gemm's a_scale_inv and b_scale_inv
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cublasHandle_t cublas = nullptr;
  ~Resources() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (cublas != nullptr) cublasDestroy(cublas);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    cudaFree(y);
    cudaFree(workspace);
    cudaFree(split);
    cudaFree(scales);
  }
};

void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(Code::kInternal, std::string(what) + " failed: " + cublasGetStatusName(status) +
                                     ": " + cublasGetStatusString(status));
}

// A uniform value in [-1, 1) from a hash of the index i (the same for every dtype).
__device__ float uniform_at(int64_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

template <class T>
__global__ void fill_uniform_kernel(T* __restrict__ x, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = from_f32<T>(uniform_at(i, seed));
}

// The same values as FP8 codes (E4M3 or E5M2, rounded to nearest).
__global__ void fill_fp8_kernel(uint8_t* __restrict__ x, int64_t n, uint32_t seed, bool e5m2) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __nv_cvt_float_to_fp8(uniform_at(i, seed), __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

void fill(void* x, DType t, int64_t n, uint32_t seed, cudaStream_t stream) {
  if (t == DType::kF8E4M3 || t == DType::kF8E5M2) {
    fill_fp8_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<uint8_t*>(x), n,
                                                                    seed, t == DType::kF8E5M2);
  } else {
    LOOM_CUDA_FLOAT_SWITCH(t, T, "gemm_bench", {
      fill_uniform_kernel<T>
          <<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(x), n, seed);
    });
  }
  launch_check("gemm_bench fill");
}

// Allocates r's A (a_bytes), B and Y, takes the bench stream and makes the events.
void prepare(Resources& r, int device, size_t a_bytes, size_t b_bytes, size_t y_bytes) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cuda_check(cudaMalloc(&r.a, a_bytes), "cudaMalloc(A)");
  cuda_check(cudaMalloc(&r.b, b_bytes), "cudaMalloc(B)");
  cuda_check(cudaMalloc(&r.y, y_bytes), "cudaMalloc(Y)");
  r.stream = bench_stream(device);
  cuda_check(cudaEventCreate(&r.start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&r.stop), "cudaEventCreate");
  cuda_check(cudaMemsetAsync(r.y, 0, y_bytes, r.stream), "cudaMemset");
}

TensorView view(void* data, DType t, int device, int64_t rows, int64_t cols) {
  TensorView v{};
  v.data = data;
  v.dtype = t;
  v.device = Device{DeviceType::kCuda, device};
  v.ndim = 2;
  v.shape[0] = rows;
  v.shape[1] = cols;
  v.strides[0] = cols;
  v.strides[1] = 1;
  return v;
}

// A call of `num_inputs` inputs and output Y on the bench stream, as a module makes it.
template <class Attrs>
OpCall make_call(TensorView* in, int num_inputs, TensorView* y, const Attrs* attrs,
                 cudaStream_t stream) {
  OpCall call{};
  call.struct_size = sizeof(OpCall);
  call.inputs = in;
  call.num_inputs = num_inputs;
  call.outputs = y;
  call.num_outputs = 1;
  call.attrs = attrs;
  call.attrs_size = sizeof(Attrs);
  call.stream = stream;
  return call;
}

double flops_of(int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

// Milliseconds per call of `body` over `iterations` calls.
template <class F>
double time_ms(Resources& r, int iterations, F&& body) {
  cuda_check(cudaEventRecord(r.start, r.stream), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) body();
  cuda_check(cudaEventRecord(r.stop, r.stream), "cudaEventRecord");
  cuda_check(cudaEventSynchronize(r.stop), "cudaEventSynchronize");
  float ms = 0.0f;
  cuda_check(cudaEventElapsedTime(&ms, r.start, r.stop), "cudaEventElapsedTime");
  return static_cast<double>(ms) / iterations;
}

// Times the first `candidates` algorithms of cuBLASLt's heuristic list for the problem that
// `p`'s matmul descriptor and layouts describe (cuBLAS's A is loom's B and its B loom's A,
// column-major; the preference of the plan cache with 256-byte alignments, which cudaMalloc's
// buffers have), each on r's buffers after a short warm-up; records the fastest in `out`.
void time_heuristic_list(Resources& r, const gemm::Plan& p, cudaDataType_t yt, double flops,
                         int device, int candidates, int iterations, float beta,
                         GemmBenchResult* out) {
  constexpr const char* kOp = "gemm_bench";
  constexpr int kMaxCandidates = 32;
  cublasLtHandle_t h = gemm::lt_handle(kOp, device);
  gemm::Preference pref(kOp, 256, 256, 256, yt);
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int count = 0;
  gemm::lt_check(
      cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.c, p.c, pref.pref,
                                     std::min(candidates, kMaxCandidates), results, &count),
      kOp, "cublasLtMatmulAlgoGetHeuristic");
  if (r.workspace == nullptr)
    cuda_check(cudaMalloc(&r.workspace, kScratchBytes), "cudaMalloc(workspace)");
  const float alpha = 1.0f;
  for (int i = 0; i < count; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > kScratchBytes)
      continue;
    auto run = [&] {
      gemm::lt_check(cublasLtMatmul(h, p.desc, &alpha, r.b, p.a, r.a, p.b, &beta, r.y, p.c, r.y,
                                    p.c, &results[i].algo, r.workspace, kScratchBytes, r.stream),
                     kOp, "cublasLtMatmul");
    };
    for (int w = 0; w < 3; ++w) run();
    const double ms = time_ms(r, iterations, run);
    ++out->candidates;
    if (out->best_rank < 0 || ms < out->best_ms) {
      out->best_rank = i;
      out->best_ms = ms;
      out->best_tflops = flops / (ms * 1e-3) / 1e12;
    }
  }
}

// The gemm problem's descriptors as gemm.cu builds them, and its heuristic list timed.
void time_candidates(Resources& r, int64_t m, int64_t n, int64_t k, DType dtype, DType y_dtype,
                     const GemmBenchOptions& o, GemmBenchResult* out) {
  constexpr const char* kOp = "gemm_bench";
  gemm::PlanOwner owner;  // destroys the descriptors at scope exit
  gemm::Plan& p = owner.plan;
  const cublasComputeType_t compute = o.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  gemm::lt_check(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F), kOp,
                 "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = o.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = o.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  gemm::set_desc(kOp, p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  gemm::set_desc(kOp, p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  // cuBLAS's problem: (n x m) = op(A) (n x k) op(B) (k x m).
  const cudaDataType_t yt = gemm::cuda_data_type(y_dtype);
  gemm::make_layouts(kOp, op_a, op_b, gemm::cuda_data_type(dtype), yt, static_cast<uint64_t>(n),
                     static_cast<uint64_t>(m), static_cast<uint64_t>(k), &p);
  time_heuristic_list(r, p, yt, flops_of(m, n, k), o.device, o.candidates, o.iterations, o.beta,
                      out);
}

void check_sizes(int64_t m, int64_t n, int64_t k, int iterations, int warmup) {
  if (m < 1 || n < 1 || k < 1 || m > INT_MAX || n > INT_MAX || k > INT_MAX)
    throw Error(Code::kInvalidArgument, "gemm_bench: M, N, K must be in [1, 2^31) (cuBLAS's int)");
  if (iterations < 1 || warmup < 0)
    throw Error(Code::kInvalidArgument, "gemm_bench: iterations must be >= 1 and warmup >= 0");
}

void run_bench(int64_t m, int64_t n, int64_t k, DType dtype, const GemmBenchOptions& o,
               GemmBenchResult* out) {
  if (!is_float_dtype(dtype))
    throw Error(Code::kInvalidArgument,
                std::string("gemm_bench: dtype ") + dtype_name(dtype) + " is not f32, bf16 or f16");
  DType y_dtype = o.y_dtype == DType::kInvalid ? dtype : o.y_dtype;
  check_sizes(m, n, k, o.iterations, o.warmup);
  if ((o.tf32 || o.tf32x3) && (dtype != DType::kF32 || y_dtype != DType::kF32))
    throw Error(Code::kInvalidArgument,
                "gemm_bench: tf32 and tf32x3 time f32 operands and an f32 Y");
  Resources r;
  const size_t ab = dtype_size(dtype), yb = dtype_size(y_dtype);
  prepare(r, o.device, static_cast<size_t>(m * k) * ab, static_cast<size_t>(k * n) * ab,
          static_cast<size_t>(m * n) * yb);
  fill(r.a, dtype, m * k, 1u, r.stream);
  fill(r.b, dtype, k * n, 2u, r.stream);

  // loom: the KernelFn with an OpCall, exactly as a module calls it.
  TensorView in[2] = {
      o.trans_a ? view(r.a, dtype, o.device, k, m) : view(r.a, dtype, o.device, m, k),
      o.trans_b ? view(r.b, dtype, o.device, n, k) : view(r.b, dtype, o.device, k, n)};
  TensorView y = view(r.y, y_dtype, o.device, m, n);
  ops::GemmAttrs attrs{o.trans_a ? 1 : 0, o.trans_b ? 1 : 0, 1.0f, o.beta};
  OpCall call = make_call(in, 2, &y, &attrs, r.stream);
  KernelFn loom_gemm = o.tf32 ? gemm_tf32 : o.tf32x3 ? gemm_tf32x3 : gemm_f32_accumulate;
  if (o.tf32x3) {  // the workspace loom::Kernel would allocate for the call (none in registers)
    call.workspace_bytes = gemm_tf32x3_workspace(&call);
    if (call.workspace_bytes > 0)
      cuda_check(cudaMalloc(&r.split, call.workspace_bytes), "cudaMalloc(tf32x3 workspace)");
    call.workspace = r.split;
  }
  auto run_loom = [&] { throw_if_error(loom_gemm(&call), "gemm_bench: loom gemm"); };

  // cuBLAS: the same column-major swap as gemm.cu (Y^T = op(B)^T op(A)^T).
  if (o.cublas) {
    cublas_check(cublasCreate(&r.cublas), "cublasCreate");
    cublas_check(cublasSetStream(r.cublas, r.stream), "cublasSetStream");
  }
  const float alpha = 1.0f, beta = o.beta;
  const int lda = static_cast<int>(o.trans_a ? m : k), ldb = static_cast<int>(o.trans_b ? k : n);
  cublasComputeType_t compute = o.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  auto run_cublas = [&] {
    cublas_check(cublasGemmEx(r.cublas, o.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              o.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                              static_cast<int>(m), static_cast<int>(k), &alpha, r.b,
                              gemm::cuda_data_type(dtype), ldb, r.a, gemm::cuda_data_type(dtype),
                              lda, &beta, r.y, gemm::cuda_data_type(y_dtype), static_cast<int>(n),
                              compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  };

  for (int i = 0; i < o.warmup; ++i) {
    run_loom();
    if (o.cublas) run_cublas();
  }
  out->loom_ms = time_ms(r, o.iterations, run_loom);
  const double flops = flops_of(m, n, k);
  out->loom_tflops = flops / (out->loom_ms * 1e-3) / 1e12;
  if (o.cublas) {
    out->cublas_ms = time_ms(r, o.iterations, run_cublas);
    out->cublas_tflops = flops / (out->cublas_ms * 1e-3) / 1e12;
  }
  if (o.candidates > 0) time_candidates(r, m, n, k, dtype, y_dtype, o, out);
}

// fp8_gemm_bench (gemm_bench.h): loom's fp8_gemm KernelFn, then (o.candidates) cuBLASLt's
// heuristic list for the same FP8 problem, with the descriptor fp8_gemm.cu builds: TN, f32
// compute and scale, the scale pointers (cuBLAS's A is loom's B), fast accumulation.
void run_fp8_bench(int64_t m, int64_t n, int64_t k, const Fp8GemmBenchOptions& o,
                   GemmBenchResult* out) {
  check_sizes(m, n, k, o.iterations, o.warmup);
  if (!is_fp8_dtype(o.a_dtype) || !is_fp8_dtype(o.b_dtype) ||
      (o.a_dtype == DType::kF8E5M2 && o.b_dtype == DType::kF8E5M2))
    throw Error(Code::kInvalidArgument,
                "gemm_bench: fp8 operands are fp8_e4m3 or fp8_e5m2, not both fp8_e5m2");
  if (!is_float_dtype(o.y_dtype))
    throw Error(Code::kInvalidArgument, "gemm_bench: an fp8 GEMM's Y is f32, bf16 or f16");
  Resources r;
  const size_t yb = dtype_size(o.y_dtype);
  prepare(r, o.device, static_cast<size_t>(m * k), static_cast<size_t>(n * k),
          static_cast<size_t>(m * n) * yb);
  fill(r.a, o.a_dtype, m * k, 1u, r.stream);
  fill(r.b, o.b_dtype, n * k, 2u, r.stream);
  const float ones[2] = {1.0f, 1.0f};  // a_scale_inv, b_scale_inv
  cuda_check(cudaMalloc(&r.scales, sizeof ones), "cudaMalloc(scale_inv)");
  cuda_check(cudaMemcpy(r.scales, ones, sizeof ones, cudaMemcpyHostToDevice),
             "cudaMemcpy(scale_inv)");
  float* scale_inv = static_cast<float*>(r.scales);

  // loom: the KernelFn with an OpCall, as nn::Linear calls it.
  TensorView in[4] = {view(r.a, o.a_dtype, o.device, m, k), view(r.b, o.b_dtype, o.device, n, k),
                      view(scale_inv, DType::kF32, o.device, 1, 1),
                      view(scale_inv + 1, DType::kF32, o.device, 1, 1)};
  for (int i = 2; i < 4; ++i) in[i].ndim = 1;  // f32 (1)
  TensorView y = view(r.y, o.y_dtype, o.device, m, n);
  ops::Fp8GemmAttrs attrs{1.0f, o.beta, o.fast_accum ? 1 : 0};
  const OpCall call = make_call(in, 4, &y, &attrs, r.stream);
  auto run_loom = [&] { throw_if_error(fp8_gemm_cublaslt(&call), "gemm_bench: loom fp8_gemm"); };
  for (int i = 0; i < o.warmup; ++i) run_loom();
  out->loom_ms = time_ms(r, o.iterations, run_loom);
  const double flops = flops_of(m, n, k);
  out->loom_tflops = flops / (out->loom_ms * 1e-3) / 1e12;
  if (o.candidates <= 0) return;

  constexpr const char* kOp = "gemm_bench";
  gemm::PlanOwner owner;  // destroys the descriptors at scope exit
  gemm::Plan& p = owner.plan;
  gemm::lt_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), kOp,
                 "cublasLtMatmulDescCreate");
  gemm::set_desc(kOp, p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  gemm::set_desc(kOp, p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  gemm::set_desc(kOp, p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                 static_cast<const void*>(scale_inv + 1));
  gemm::set_desc(kOp, p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                 static_cast<const void*>(scale_inv));
  gemm::set_desc(kOp, p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(o.fast_accum));
  // cuBLAS's column-major problem: C (n x m) = A^T (n x k) B (k x m), ld k for both operands.
  const cudaDataType_t yt = gemm::cuda_data_type(o.y_dtype);
  gemm::lt_check(cublasLtMatrixLayoutCreate(&p.a, gemm::cuda_data_type(o.b_dtype),
                                            static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
                 kOp, "cublasLtMatrixLayoutCreate(A)");
  gemm::lt_check(cublasLtMatrixLayoutCreate(&p.b, gemm::cuda_data_type(o.a_dtype),
                                            static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
                 kOp, "cublasLtMatrixLayoutCreate(B)");
  gemm::lt_check(
      cublasLtMatrixLayoutCreate(&p.c, yt, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n),
      kOp, "cublasLtMatrixLayoutCreate(C)");
  time_heuristic_list(r, p, yt, flops, o.device, o.candidates, o.iterations, o.beta, out);
}

}  // namespace

GemmBenchResult gemm_bench(int64_t m, int64_t n, int64_t k, DType dtype,
                           const GemmBenchOptions& options) {
  GemmBenchResult result;
  Status s = guard([&] { run_bench(m, n, k, dtype, options, &result); });
  if (s.code != Code::kOk) {
    result = GemmBenchResult{};
    result.error = take_message(&s);
  }
  return result;
}

GemmBenchResult fp8_gemm_bench(int64_t m, int64_t n, int64_t k,
                               const Fp8GemmBenchOptions& options) {
  GemmBenchResult result;
  Status s = guard([&] { run_fp8_bench(m, n, k, options, &result); });
  if (s.code != Code::kOk) {
    result = GemmBenchResult{};
    result.error = take_message(&s);
  }
  return result;
}

}  // namespace loom::kernels::cuda
