// gemm (loom/ops.h) on CUDA through cuBLASLt: Y[b] = alpha * op(A[b]) @ op(B[b]) + beta * Y[b].
//
// Layout. loom tensors are row-major and cuBLAS matrices column-major; a row-major (R, C)
// matrix read column-major (leading dimension C) is its transpose (C, R). So the row-major
// Y (M, N) = op(A) (M, K) @ op(B) (K, N) is computed as the column-major product
// Y^T (N, M) = op(B)^T (N, K) @ op(A)^T (K, M): loom's B is cuBLAS's first operand, loom's
// A its second, each with its own transpose flag unchanged:
//   cuBLAS A = loom B  trans_b = 0: stored (K, N) row-major = (N, K) col-major, ld N, op N
//                      trans_b = 1: stored (N, K) row-major = (K, N) col-major, ld K, op T
//   cuBLAS B = loom A  trans_a = 0: stored (M, K) row-major = (K, M) col-major, ld K, op N
//                      trans_a = 1: stored (K, M) row-major = (M, K) col-major, ld M, op T
//   cuBLAS C = D = loom Y: (M, N) row-major = (N, M) col-major, ld N
// so cuBLAS's (m, n, k) is loom's (N, M, K).
//
// Batches. A 2-D B shared by a batch with A not transposed folds the batch into M (A is then
// one (batch * M, K) matrix and Y one (batch * M, N)): a single larger GEMM. Otherwise B
// with batch dimensions runs as one strided-batched matmul (strides M*K, K*N, M*N), and the
// rare shared B with a transposed A runs one matmul per batch index.
//
// Precision. Kernel "cuda" computes with CUBLAS_COMPUTE_32F for the 32- and 16-bit dtypes:
// f32 operands in full f32 (no TF32, the op's contract), bf16 / f16 operands on tensor cores
// with f32 accumulation; Y is written in the operands' dtype or in f32 (weight gradients
// accumulated with beta = 1). f64 operands (A, B and Y all f64: the fp64 router; keyed on
// f64) run with CUBLAS_COMPUTE_64F and f64 alpha / beta (cuBLASLt's DGEMM). Kernel
// "cuda.tf32" (f32 only, priority 15, so only a spec that pins it gets it) uses
// CUBLAS_COMPUTE_32F_FAST_TF32. cuBLASLt has no A and B of different dtypes, and no Y in
// another 16-bit dtype: `supports` declines those calls.
//
// State. One cublasLt handle per device (created on first use, under a mutex); the
// workspace is the 32 MiB scratch of the (device, stream) pair (common/resources.cuh); a plan
// (matmul and layout descriptors, and the algorithm cublasLtMatmulAlgoGetHeuristic picks,
// given the operands' real pointer alignment) is cached per problem (cublaslt.cuh). K == 0
// is an empty sum: a small kernel writes Y = beta * Y (0 when beta == 0).
#include <cublasLt.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/gemm.h>

#include <array>
#include <climits>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/gemm/cublaslt.cuh"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/registry.cuh"

namespace loom::kernels::cuda {
namespace gemm {
namespace {

using op_checks::GemmShape;

constexpr const char* kOp = ops::kGemm;

// The dtype combinations cuBLASLt runs (see the file comment); throws otherwise.
void check_cuda_dtypes(const OpCall* call, bool tf32) {
  DType a = call->inputs[0].dtype, b = call->inputs[1].dtype, y = call->outputs[0].dtype;
  if (a != b)
    throw Error(Code::kInvalidArgument,
                std::string("gemm: A is ") + dtype_name(a) + " and B is " + dtype_name(b) +
                    ": the CUDA gemm takes A and B of one dtype (cast one of them first)");
  if (y != a && y != DType::kF32)
    throw Error(Code::kInvalidArgument, std::string("gemm: Y is ") + dtype_name(y) + " with " +
                                            dtype_name(a) +
                                            " operands: the CUDA gemm writes Y in the operands' "
                                            "dtype or in f32");
  if ((a == DType::kF64) != (y == DType::kF64))
    throw Error(Code::kInvalidArgument, std::string("gemm: Y is ") + dtype_name(y) + " with " +
                                            dtype_name(a) +
                                            " operands: an f64 gemm takes f64 A, B and Y");
  if (tf32 && (a != DType::kF32 || y != DType::kF32))
    throw Error(Code::kInvalidArgument,
                "gemm: cuda.tf32 takes f32 operands and an f32 Y (bf16 and f16 run on tensor "
                "cores in the 'cuda' kernel)");
}

// One cublasLtMatmul problem, in cuBLAS's column-major terms (see the file comment).
struct Problem {
  int64_t device, compute, ab_type, y_type;
  int64_t op_a, op_b;                    // cublasOperation_t of cuBLAS's A (loom B) and B (loom A)
  int64_t m, n, k;                       // loom's N, M, K
  int64_t batch;                         // strided batch count (1: none)
  int64_t stride_a, stride_b, stride_c;  // elements between batch matrices
  int64_t align_a, align_b, align_c;     // bytes
  std::array<int64_t, 16> key() const {
    return {device, compute, ab_type,  y_type,   op_a,     op_b,    m,       n,
            k,      batch,   stride_a, stride_b, stride_c, align_a, align_b, align_c};
  }
};

std::string describe(const Problem& p) {
  return "(cuBLAS m = " + std::to_string(p.m) + ", n = " + std::to_string(p.n) +
         ", k = " + std::to_string(p.k) + ", batch " + std::to_string(p.batch) + ", alignments " +
         std::to_string(p.align_a) + "/" + std::to_string(p.align_b) + "/" +
         std::to_string(p.align_c) + " bytes)";
}

// The plan of `p`: its descriptors, and the algorithm choose_algo keeps of the heuristic's
// list (its first, unless LOOM_GEMM_ALGO=measured), tried on `trial`.
void make_plan(cublasLtHandle_t h, const Problem& p, const TrialCall& trial, Plan* out) {
  Plan& plan = *out;
  // alpha and beta: f64 with CUBLAS_COMPUTE_64F, f32 otherwise.
  const cudaDataType_t scale = p.compute == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;
  lt_check(cublasLtMatmulDescCreate(&plan.desc, static_cast<cublasComputeType_t>(p.compute), scale),
           kOp, "cublasLtMatmulDescCreate");
  auto op_a = static_cast<cublasOperation_t>(p.op_a), op_b = static_cast<cublasOperation_t>(p.op_b);
  set_desc(kOp, plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(kOp, plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  auto ab = static_cast<cudaDataType_t>(p.ab_type), y = static_cast<cudaDataType_t>(p.y_type);
  make_layouts(kOp, op_a, op_b, ab, y, p.m, p.n, p.k, &plan);
  if (p.batch > 1) {
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {plan.a, p.stride_a}, {plan.b, p.stride_b}, {plan.c, p.stride_c}};
    for (const auto& [layout, stride] : layouts) {
      set_layout(kOp, layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(p.batch));
      set_layout(kOp, layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
    }
  }
  Preference pref(kOp, static_cast<uint32_t>(p.align_a), static_cast<uint32_t>(p.align_b),
                  static_cast<uint32_t>(p.align_c), y);
  cublasLtMatmulHeuristicResult_t results[kMeasuredCandidates] = {};
  int count = 0;
  cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(h, plan.desc, plan.a, plan.b, plan.c, plan.c, pref.pref,
                                     heuristic_request(kOp), results, &count);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && count == 0))
    throw Error(Code::kUnimplemented, std::string("gemm: cuBLASLt has no algorithm for ") +
                                          describe(p) + " (" + cublasLtGetStatusName(status) + ")");
  lt_check(status, kOp, "cublasLtMatmulAlgoGetHeuristic");
  const int pick = choose_algo(kOp, describe(p), h, plan.desc, plan, results, count, trial);
  plan.algo = results[pick].algo;
  plan.workspace = results[pick].workspaceSize;
}

// The cached plan of `p`, made on first use (see PlanCache::get for `owner`).
Plan plan_for(cublasLtHandle_t h, const Problem& p, const TrialCall& trial, PlanOwner* owner) {
  static auto* cache = new PlanCache<std::array<int64_t, 16>>();  // leaked
  return cache->get(p.key(), owner, [&](Plan* plan) { make_plan(h, p, trial, plan); });
}

void gemm_run(const OpCall* call, bool tf32) {
  GemmShape s = op_checks::check_gemm(call, false, DeviceType::kCuda);
  check_cuda_dtypes(call, tf32);
  const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
  const ops::GemmAttrs& at = s.attrs;
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  int device = current_device(ops::kGemm, Y);
  cudaStream_t stream = stream_of(call);
  if (s.k == 0) {
    scale_y(kOp, Y, at.beta, stream);
    return;
  }
  const bool fold = s.batch == 1 || (s.shared_b && !at.trans_a);
  const bool loop = !fold && s.shared_b;  // shared B, transposed A
  if (!fold && !loop && s.batch > INT32_MAX)
    throw Error(Code::kInvalidArgument,
                "gemm: batch " + std::to_string(s.batch) + " exceeds cuBLASLt's int32 batch count");
  const int64_t ab = static_cast<int64_t>(dtype_size(A.dtype));
  const int64_t yb = static_cast<int64_t>(dtype_size(Y.dtype));
  const int64_t a_size = s.m * s.k, b_size = s.k * s.n, y_size = s.m * s.n;  // per batch

  Problem p{};
  p.device = device;
  const bool f64 = A.dtype == DType::kF64;
  p.compute = f64 ? CUBLAS_COMPUTE_64F : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  p.ab_type = cuda_data_type(A.dtype);
  p.y_type = cuda_data_type(Y.dtype);
  p.op_a = at.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.op_b = at.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.m = s.n;
  p.n = fold ? s.batch * s.m : s.m;
  p.k = s.k;
  p.batch = fold || loop ? 1 : s.batch;
  p.stride_a = p.batch > 1 ? b_size : 0;
  p.stride_b = p.batch > 1 ? a_size : 0;
  p.stride_c = p.batch > 1 ? y_size : 0;
  // Every matrix a call touches: the loop steps loom's A and Y by a batch each.
  const bool stepped = p.batch > 1 || loop;
  p.align_a = alignment_of(B.data, p.batch > 1 ? b_size * ab : 0);
  p.align_b = alignment_of(A.data, stepped ? a_size * ab : 0);
  p.align_c = alignment_of(Y.data, stepped ? y_size * yb : 0);

  cublasLtHandle_t h = lt_handle(kOp, device);
  const float alpha = at.alpha, beta = at.beta;
  const double alpha64 = at.alpha, beta64 = at.beta;  // CUBLAS_COMPUTE_64F's scale type
  const void* alpha_ptr = f64 ? static_cast<const void*>(&alpha64) : &alpha;
  const void* beta_ptr = f64 ? static_cast<const void*>(&beta64) : &beta;
  // One matmul's operands (the loop's first), for a measured choice of algorithm.
  const size_t y_bytes = static_cast<size_t>((loop ? y_size : numel(Y)) * yb);
  const TrialCall trial{B.data, A.data, y_bytes, alpha_ptr, beta_ptr, stream, device};
  PlanOwner owner;
  Plan plan = plan_for(h, p, trial, &owner);
  Scratch ws = stream_scratch(device, stream);
  const int64_t calls = loop ? s.batch : 1;
  for (int64_t b = 0; b < calls; ++b) {
    const char* a_ptr = static_cast<const char*>(A.data) + b * a_size * ab;
    char* y_ptr = static_cast<char*>(Y.data) + b * y_size * yb;
    // cuBLAS's A is loom's B, its B loom's A; C and D are both Y (in place, beta reads it).
    lt_check(cublasLtMatmul(h, plan.desc, alpha_ptr, B.data, plan.a, a_ptr, plan.b, beta_ptr, y_ptr,
                            plan.c, y_ptr, plan.c, &plan.algo, ws.data, plan.workspace, stream),
             kOp, "cublasLtMatmul");
  }
  mark_written(Y.data, static_cast<size_t>(numel(Y) * yb), stream);  // for initcheck
}

Status gemm_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    GemmShape s = op_checks::check_gemm(call, true, DeviceType::kCuda);
    *out = io_cost(call, 2.0 * s.batch * s.m * s.n * s.k);
    if (s.attrs.beta != 0.0f)  // Y is read too
      out->bytes_read += static_cast<double>(numel(call->outputs[0])) *
                         static_cast<double>(dtype_size(call->outputs[0].dtype));
  });
}

bool supports(const OpCall* call, bool tf32) {
  return check_passes([&] {
    GemmShape s = op_checks::check_gemm(call, true, DeviceType::kCuda);
    check_cuda_dtypes(call, tf32);
    bool fold = s.batch == 1 || s.shared_b;
    if (!fold && s.batch > INT32_MAX) throw 0;
  });
}

bool gemm_supports(const OpCall* call) { return supports(call, false); }
bool gemm_tf32_supports(const OpCall* call) { return supports(call, true); }

}  // namespace

void add_gemm_op_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kGemm, gemm_f32_accumulate, gemm_supports, gemm_cost);
  add_cuda_kernels(out, ops::kGemm, gemm_f64, gemm_supports, gemm_cost, {DType::kF64});
  add_cuda_kernels(out, ops::kGemm, gemm_tf32, gemm_tf32_supports, gemm_cost, {DType::kF32},
                   "cuda.tf32", kCudaPriority - 5);
}

}  // namespace gemm

Status gemm_f32_accumulate(const OpCall* call) {
  return guard([&] { gemm::gemm_run(call, false); });
}

Status gemm_tf32(const OpCall* call) {
  return guard([&] { gemm::gemm_run(call, true); });
}

Status gemm_f64(const OpCall* call) {
  return guard([&] { gemm::gemm_run(call, false); });
}

}  // namespace loom::kernels::cuda
