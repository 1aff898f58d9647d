// The cuBLASLt helpers of the gemm family (cublaslt.cuh).
#include <loom/cpp/error.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/gemm/cublaslt.cuh"

namespace loom::kernels::cuda::gemm {

void lt_check(cublasStatus_t status, const char* op, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  Code code = Code::kInternal;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) code = Code::kResourceExhausted;
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) code = Code::kUnimplemented;
  throw Error(code, std::string(op) + ": " + what + " failed: " + cublasLtGetStatusName(status) +
                        ": " + cublasLtGetStatusString(status));
}

void mark_written(void* p, size_t bytes, cudaStream_t stream) {
  static const bool on = [] {
    const char* e = std::getenv("LOOM_NVTX_MARK");
    return e == nullptr || std::string(e) != "0";
  }();
  if (!on || p == nullptr || bytes == 0) return;
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("loom");
  nvtxMemVirtualRangeDesc_t range{};
  range.size = bytes;
  range.ptr = p;
  nvtxMemMarkInitializedBatch_t desc{};
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = sizeof(desc);
  desc.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.regionDescCount = 1;
  desc.regionDescElementSize = sizeof(range);
  desc.regionDescElements = &range;
  nvtxMemCudaMarkInitialized(domain, stream, 0, &desc);
}

cublasLtHandle_t lt_handle(const char* op, int device) {
  static std::mutex mutex;
  static auto* handles = new std::map<int, cublasLtHandle_t>();  // leaked: see common/resources.cuh
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  cublasLtHandle_t h = nullptr;
  lt_check(cublasLtCreate(&h), op, "cublasLtCreate");
  (*handles)[device] = h;
  return h;
}

uint32_t alignment_of(const void* p, int64_t stride_bytes) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

uint32_t split_k_reductions(cudaDataType_t y_type) {
  static const bool compute_type_only =
      env_choice("gemm", "LOOM_CUBLASLT_REDUCTION", {"auto", "compute_type"}) == 1;
  if (!compute_type_only && (y_type == CUDA_R_32F || y_type == CUDA_R_64F))
    return static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK);
  return static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
}

Preference::Preference(const char* op, uint32_t align_a, uint32_t align_b, uint32_t align_c,
                       cudaDataType_t y_type, uint64_t max_workspace) {
  lt_check(cublasLtMatmulPreferenceCreate(&pref), op, "cublasLtMatmulPreferenceCreate");
  set_pref(op, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace);
  set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
  set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
  // Split-K partial sums in the compute type (split_k_reductions): with a bf16 or f16 Y the
  // in-place and output-type schemes would add the parts in Y's dtype, against the ops'
  // "compute in f32" (loom/ops.h). On an H200 (2026-11-27) the bf16 GELU_AUX epilogue's P at
  // K = 65 and 127 was off by up to 0.0156 (one bf16 unit at magnitude 2) where |P| was
  // 0.03-0.08, and f16's was not: consistent with bf16 partial sums (not yet rerun with this
  // mask). Algorithms without split-K (scheme NONE) stay allowed.
  set_pref(op, pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, split_k_reductions(y_type));
}

void make_layouts(const char* op, cublasOperation_t op_a, cublasOperation_t op_b, cudaDataType_t ab,
                  cudaDataType_t y, uint64_t m, uint64_t n, uint64_t k, Plan* plan) {
  const uint64_t a_rows = op_a == CUBLAS_OP_N ? m : k, a_cols = op_a == CUBLAS_OP_N ? k : m;
  const uint64_t b_rows = op_b == CUBLAS_OP_N ? k : n, b_cols = op_b == CUBLAS_OP_N ? n : k;
  lt_check(cublasLtMatrixLayoutCreate(&plan->a, ab, a_rows, a_cols, static_cast<int64_t>(a_rows)),
           op, "cublasLtMatrixLayoutCreate(A)");
  lt_check(cublasLtMatrixLayoutCreate(&plan->b, ab, b_rows, b_cols, static_cast<int64_t>(b_rows)),
           op, "cublasLtMatrixLayoutCreate(B)");
  lt_check(cublasLtMatrixLayoutCreate(&plan->c, y, m, n, static_cast<int64_t>(m)), op,
           "cublasLtMatrixLayoutCreate(C)");
}

int heuristic_request(const char* op) {
  static const bool measured = env_choice(op, "LOOM_GEMM_ALGO", {"heuristic", "measured"}) == 1;
  return measured ? kMeasuredCandidates : 1;
}

namespace {

constexpr int kTrialRuns = 5;

// Stream-ordered device memory for choose_algo's scratch Y, freed (on the stream) at scope
// exit; the synchronisation after the free hands it back to the device at once (the default
// pool keeps freed memory until the next one), not at the step's next.
struct TrialScratch {
  void* data = nullptr;
  cudaStream_t stream = nullptr;
  ~TrialScratch() {
    if (data == nullptr) return;
    cudaFreeAsync(data, stream);
    cudaStreamSynchronize(stream);
  }
};

// Two events, destroyed at scope exit.
struct TrialEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~TrialEvents() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
};

}  // namespace

int choose_algo(const char* op, const std::string& problem, cublasLtHandle_t h,
                cublasLtMatmulDesc_t desc, const Plan& plan,
                const cublasLtMatmulHeuristicResult_t* results, int count, const TrialCall& call) {
  if (count <= 1) return 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(call.stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return 0;
  TrialScratch y;
  y.stream = call.stream;
  if (cudaMallocAsync(&y.data, call.y_bytes, call.stream) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it, keep the heuristic's first
    y.data = nullptr;
    return 0;
  }
  cuda_check(cudaMemsetAsync(y.data, 0, call.y_bytes, call.stream), "cudaMemsetAsync");
  TrialEvents ev;
  cuda_check(cudaEventCreate(&ev.start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&ev.stop), "cudaEventCreate");
  const Scratch ws = stream_scratch(call.device, call.stream);
  int best = -1;
  float best_ms = 0.0f, first_ms = -1.0f;
  for (int i = 0; i < count; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > ws.bytes) continue;
    auto run = [&] {
      return cublasLtMatmul(h, desc, call.alpha, call.a, plan.a, call.b, plan.b, call.beta, y.data,
                            plan.c, y.data, plan.c, &results[i].algo, ws.data,
                            results[i].workspaceSize, call.stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    cuda_check(cudaEventRecord(ev.start, call.stream), "cudaEventRecord");
    bool ran = true;
    for (int r = 0; r < kTrialRuns && ran; ++r) ran = run() == CUBLAS_STATUS_SUCCESS;
    cuda_check(cudaEventRecord(ev.stop, call.stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(ev.stop), "cudaEventSynchronize");
    if (!ran) continue;
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime");
    ms /= kTrialRuns;
    if (i == 0) first_ms = ms;
    if (best < 0 || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  if (best < 0) return 0;
  if (best != 0) {
    const std::string first =
        first_ms >= 0.0f ? std::to_string(first_ms) + " ms" : std::string("did not run");
    std::fprintf(stderr,
                 "%s: LOOM_GEMM_ALGO=measured: %s runs cuBLASLt's algorithm %d of %d (%g ms a "
                 "call; the heuristic's first: %s)\n",
                 op, problem.c_str(), best + 1, count, static_cast<double>(best_ms), first.c_str());
  }
  return best;
}

Preference::~Preference() {
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
}

PlanOwner::~PlanOwner() {
  if (keep) return;
  if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
}

namespace {

template <class T>
__global__ void scale_y_kernel(T* __restrict__ y, int64_t n, float beta) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f32<T>(beta == 0.0f ? 0.0f : beta * to_f32<T>(y[i]));
}

__global__ void scale_y_f64_kernel(double* __restrict__ y, int64_t n, double beta) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = beta == 0.0 ? 0.0 : beta * y[i];
}

}  // namespace

void scale_y(const char* op, const TensorView& Y, float beta, cudaStream_t stream) {
  if (beta == 1.0f) return;
  const int64_t n = numel(Y);
  if (Y.dtype == DType::kF64) {
    scale_y_f64_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<double*>(Y.data), n, static_cast<double>(beta));
    launch_check(op);
    return;
  }
  LOOM_CUDA_FLOAT_SWITCH(Y.dtype, T, op, {
    scale_y_kernel<T>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(Y.data), n, beta);
  });
  launch_check(op);
}

}  // namespace loom::kernels::cuda::gemm
