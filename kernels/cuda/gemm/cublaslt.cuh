// What the cuBLASLt kernels of the gemm family (gemm.cu, fp8_gemm.cu) share: status checks,
// the per-device handle, descriptor setters, the plan cache, the K == 0 case, and the
// dtype mapping (which the lab's gemm_bench uses too).
//
// A plan is the problem's matrix layouts and the algorithm cublasLtMatmulAlgoGetHeuristic
// picked for it (and, for gemm, its matmul descriptor). Plans are cached per problem for the
// life of the process (never destroyed: see common/resources.cuh), at most kMaxPlans per cache.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <loom/kernel.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/common/resources.cuh"

namespace loom::kernels::cuda::gemm {

/// Throws Error naming `op` and the cuBLASLt call `what` unless `status` is success
/// (kResourceExhausted for an allocation failure, kUnimplemented for "not supported",
/// kInternal otherwise).
void lt_check(cublasStatus_t status, const char* op, const char* what);

/// The cublasLt handle of `device`, created on first use.
cublasLtHandle_t lt_handle(const char* op, int device);

/// Largest power of two <= 256 that divides the address `p` and `stride_bytes` (the distance
/// to the next batch matrix, 0 when there is none): what every matrix of the call is
/// aligned to.
uint32_t alignment_of(const void* p, int64_t stride_bytes);

template <class V>
void set_desc(const char* op, cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
              V value) {
  lt_check(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)), op,
           "cublasLtMatmulDescSetAttribute");
}
template <class V>
void set_layout(const char* op, cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                V value) {
  lt_check(cublasLtMatrixLayoutSetAttribute(l, attr, &value, sizeof(value)), op,
           "cublasLtMatrixLayoutSetAttribute");
}
template <class V>
void set_pref(const char* op, cublasLtMatmulPreference_t p,
              cublasLtMatmulPreferenceAttributes_t attr, V value) {
  lt_check(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)), op,
           "cublasLtMatmulPreferenceSetAttribute");
}

/// The preference of a heuristic query: at most `max_workspace` bytes of workspace (by
/// default the whole stream scratch), and the operands' real alignments in bytes (the default
/// assumes 256-byte aligned operands; a view into a larger buffer may not be), and which
/// split-K reductions the algorithm may use (split_k_reductions). Destroyed at scope exit.
struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  /// \param y_type  the data type of C and D (Y): it decides the reduction schemes
  Preference(const char* op, uint32_t align_a, uint32_t align_b, uint32_t align_c,
             cudaDataType_t y_type, uint64_t max_workspace = kScratchBytes);
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  ~Preference();
};

/// The split-K reduction schemes (cublasLtReductionScheme_t mask) an algorithm with f32
/// (or, for f64 GEMMs, f64) compute may use when Y has data type `y_type`. The ops compute in
/// f32 (loom/ops.h), so partial sums may not be added in a narrower Y's dtype: for a bf16 or
/// f16 Y only COMPUTE_TYPE (partial sums in f32 in the workspace). For an f32 or f64 Y every
/// scheme adds in the compute type (INPLACE and OUTPUT_TYPE add in Y's, which is it), so all
/// are allowed, as cuBLAS's own GEMMs allow them: the f32 GEMMs and every weight gradient
/// (f32, beta 1), whose small outputs and long K are what split-K is for. Every scheme adds
/// its parts in a fixed order: results do not vary from run to run.
/// LOOM_CUBLASLT_REDUCTION=compute_type restricts f32 / f64 Y to COMPUTE_TYPE as well, to
/// measure one against the other (tools/gpu_bundle_run.sh's GEMM section).
uint32_t split_k_reductions(cudaDataType_t y_type);

/// A cached problem's descriptors and algorithm (`desc` may stay null when the kernel makes
/// its matmul descriptor per call).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

/// How many algorithms a plan asks cuBLASLt's heuristic for: 1, its first (the default), or
/// kMeasuredCandidates under LOOM_GEMM_ALGO=measured, which choose_algo then times. The
/// variable is read once: "heuristic" (or unset) or "measured".
int heuristic_request(const char* op);
inline constexpr int kMeasuredCandidates = 8;

/// The call a plan is made for, as choose_algo runs its candidates: cuBLAS's A and B (loom's
/// B and A: read only), the bytes of C = D (the candidates write a scratch of that size,
/// never the call's Y), alpha and beta in the matmul descriptor's scale type, and the stream.
struct TrialCall {
  const void* a = nullptr;
  const void* b = nullptr;
  size_t y_bytes = 0;
  const void* alpha = nullptr;
  const void* beta = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
};

/// The index in results[0, count) of the algorithm a plan keeps. 0, the heuristic's first,
/// when count is 1 or the stream is capturing a CUDA graph (nothing can be timed there; the
/// first is kept). Otherwise (LOOM_GEMM_ALGO=measured) each candidate runs once untimed and
/// 5 times between two events on `call`'s operands, with C = D a zeroed scratch of
/// y_bytes (stream-ordered memory, freed after) and the stream's scratch as workspace, and
/// the fastest mean wins (a tie keeps the earlier). A candidate that fails to run is left out;
/// when the scratch cannot be allocated the first is kept. Synchronises the stream. Prints
/// one line to stderr, naming `op` and `problem`, when the pick is not the first.
/// The choice follows timings: two runs may pick different algorithms for one problem and so
/// differ in their last bits (the sum's order), which the heuristic's fixed pick does not.
/// \param op, problem  the op's name and the problem in words, for the stderr line
/// \param h            the device's cuBLASLt handle
/// \param desc, plan   the matmul descriptor (with the call's pointers: scales, bias, aux) and
///                     the plan's layouts
/// \param results      cuBLASLt's heuristic list, best first, `count` of them
/// \param call         the operands, scalars and stream to try them on
int choose_algo(const char* op, const std::string& problem, cublasLtHandle_t h,
                cublasLtMatmulDesc_t desc, const Plan& plan,
                const cublasLtMatmulHeuristicResult_t* results, int count, const TrialCall& call);

/// Creates plan->a, plan->b and plan->c for cuBLAS's column-major problem C (m, n) =
/// op_a(A) (m, k) op_b(B) (k, n): A and B of data type `ab` stored before their op (ld = rows),
/// C of data type `y` with ld = m. Throws naming `op` when cuBLASLt refuses one.
void make_layouts(const char* op, cublasOperation_t op_a, cublasOperation_t op_b, cudaDataType_t ab,
                  cudaDataType_t y, uint64_t m, uint64_t n, uint64_t k, Plan* plan);

/// Destroys the plan's descriptors at scope exit unless `keep` (it went into the cache).
struct PlanOwner {
  Plan plan;
  bool keep = false;
  PlanOwner() = default;
  PlanOwner(const PlanOwner&) = delete;
  PlanOwner& operator=(const PlanOwner&) = delete;
  ~PlanOwner();
};

/// Plans by problem key (any ordered type), made on first use.
template <class Key>
class PlanCache {
 public:
  static constexpr size_t kMaxPlans = 4096;

  /// The cached plan of `key`; on a miss `make(&owner->plan)` fills one (outside the lock:
  /// the heuristic takes tens of microseconds), which goes into the cache unless it is full
  /// or another thread cached one first. `owner` keeps a plan that did not go into the cache
  /// alive until the caller is done with it.
  template <class Make>
  Plan get(const Key& key, PlanOwner* owner, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    make(&owner->plan);
    std::lock_guard<std::mutex> lock(mutex_);
    if (plans_.size() >= kMaxPlans) return owner->plan;
    auto [it, inserted] = plans_.emplace(key, owner->plan);
    owner->keep = inserted;  // else another thread cached one first: ours is destroyed
    return it->second;
  }

 private:
  std::mutex mutex_;
  std::map<Key, Plan> plans_;
};

/// Y = beta * Y, or 0 when beta == 0 (without reading Y, which may hold NaN), for a float Y
/// on `stream`: the GEMMs' answer when K == 0 (an empty sum).
void scale_y(const char* op, const TensorView& Y, float beta, cudaStream_t stream);

/// Tells compute-sanitizer's initcheck (run with --nvtx yes) that cuBLASLt wrote the `bytes`
/// at `p` on `stream`: its sm_90 kernels store their output through TMA, which initcheck does
/// not see, so the output's first reader would be reported as reading uninitialised memory
/// (tests/kernels/cuda/initcheck_probe.cc decides this on a GPU). One NVTX call, a no-op
/// unless a tool is attached; the environment variable LOOM_NVTX_MARK=0 turns it off.
void mark_written(void* p, size_t bytes, cudaStream_t stream);

/// The cuBLASLt data type of a GEMM operand's dtype (f32, bf16, f16, fp8_e4m3, fp8_e5m2;
/// anything else maps to CUDA_R_32F: the callers' checks admit only those).
inline cudaDataType_t cuda_data_type(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF64:
      return CUDA_R_64F;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kF8E5M2:
      return CUDA_R_8F_E5M2;
    default:
      return CUDA_R_32F;
  }
}

}  // namespace loom::kernels::cuda::gemm
