// fp8_gemm (loom/ops.h) on CUDA through cuBLASLt:
// Y (M, N) = alpha * (A * a_scale_inv[0]) @ (B * b_scale_inv[0])^T + beta * Y, with A (M, K)
// and B (N, K) in FP8 and Y in f32, bf16 or f16.
//
// Layout. On Hopper cuBLASLt runs FP8 in one layout, "TN": its A transposed and its B not,
// so both operands are K-contiguous column-major matrices, which is how loom stores A and B
// (row-major, K last). As in gemm.cu, row-major Y (M, N) is column-major Y^T (N, M) with
// ld N, and Y^T (N, M) = B (N, K) @ A^T (K, M):
//   cuBLAS A = loom B: stored (N, K) row-major = (K, N) col-major, ld K; op T gives (N, K)
//   cuBLAS B = loom A: stored (M, K) row-major = (K, M) col-major, ld K; op N keeps (K, M)
//   cuBLAS C = D = loom Y: (M, N) row-major = (N, M) col-major, ld N
// so cuBLAS's (m, n, k) is loom's (N, M, K), and its A / B scale pointers are loom's
// b_scale_inv / a_scale_inv (f32 scalars in device memory: no host round trip).
//
// Types. Compute CUBLAS_COMPUTE_32F with scale type CUDA_R_32F (the only FP8 combination);
// operands E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3 (the shared checks refuse E5M2 x E5M2);
// C = D = Y's dtype, each a row of cuBLASLt's FP8 type table (C = D = f32, bf16 or f16), so
// beta reads Y in its own dtype. attrs.fast_accum sets CUBLASLT_MATMUL_DESC_FAST_ACCUM
// (sums kept in the tensor cores' reduced precision instead of promoted to f32 regularly).
//
// Requirements, which `supports` declines on and a call reports (kUnimplemented): compute
// capability 8.9 or later (FP8 tensor cores: Ada, Hopper, Blackwell), and cuBLASLt's FP8
// alignment: K a multiple of 16 (rows of A and B, lda = ldb = K bytes), rows of Y a multiple
// of 16 bytes (N a multiple of 4 for f32 Y, of 8 for bf16 or f16; ldc = N) and A, B, Y at
// 16-byte aligned addresses. M is free.
//
// State. gemm.cu's per-device handle, the stream scratch as workspace, and a cache of plans
// (layouts and the heuristic's algorithm) per problem (cublaslt.cuh). The matmul descriptor
// is made per call, on the stack (cublasLtMatmulDescInit: no allocation), because it holds
// the call's scale pointers: a cached plan never carries another call's pointers, and two
// threads never write one descriptor. K == 0 is an empty sum: Y = beta * Y.
#include <cublasLt.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/fp8.h>

#include <array>
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

using op_checks::Fp8GemmShape;

constexpr const char* kOp = ops::kFp8Gemm;
constexpr int kMinCapability = 89;  // sm_89

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Why cuBLASLt's FP8 kernels cannot take this call's shapes or addresses, or "" when they
// can (see the file comment). Null data (inside `supports`) counts as aligned.
std::string layout_problem(const Fp8GemmShape& s, const OpCall* call) {
  const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
  const int64_t y_row_bytes = s.n * static_cast<int64_t>(dtype_size(Y.dtype));
  std::string why;
  if (s.k % 16 != 0)
    why = "K = " + std::to_string(s.k) + " is not a multiple of 16";
  else if (y_row_bytes % 16 != 0)
    why = "a row of Y (N = " + std::to_string(s.n) + " " + dtype_name(Y.dtype) + ") is " +
          std::to_string(y_row_bytes) + " bytes, not a multiple of 16";
  else if (!aligned16(A.data) || !aligned16(B.data) || !aligned16(Y.data))
    why = "A, B or Y does not start at a 16-byte aligned address";
  if (why.empty()) return why;
  return std::string(kOp) + ": " + why +
         ": cuBLASLt's FP8 GEMMs need K a multiple of 16, rows of Y a multiple of 16 bytes (N a "
         "multiple of 4 for an f32 Y, of 8 for bf16 or f16) and A, B and Y 16-byte aligned; pad "
         "the dimension or run this GEMM in bf16";
}

// Why `device` cannot run FP8 GEMMs, or "" when it can or the runtime cannot tell (then the
// call itself fails with the runtime's reason).
std::string capability_problem(int device) {
  const int cc = compute_capability(device);
  if (cc == 0 || cc >= kMinCapability) return "";
  return std::string(kOp) + ": cuda:" + std::to_string(device) + " has compute capability " +
         std::to_string(cc / 10) + "." + std::to_string(cc % 10) + " (sm_" + std::to_string(cc) +
         "): fp8_gemm needs sm_89 or later (FP8 tensor cores: Ada, Hopper, Blackwell)";
}

// One problem in cuBLAS's column-major terms: (m, n, k) = loom's (N, M, K); type_a is loom
// B's dtype, type_b loom A's.
struct Problem {
  int64_t device, type_a, type_b, type_y, fast_accum;
  int64_t m, n, k;
  int64_t align_a, align_b, align_c;  // bytes
  std::array<int64_t, 11> key() const {
    return {device, type_a, type_b, type_y, fast_accum, m, n, k, align_a, align_b, align_c};
  }
};

std::string describe(const Problem& p) {
  return "(cuBLAS m = " + std::to_string(p.m) + ", n = " + std::to_string(p.n) +
         ", k = " + std::to_string(p.k) + ", alignments " + std::to_string(p.align_a) + "/" +
         std::to_string(p.align_b) + "/" + std::to_string(p.align_c) + " bytes)";
}

// The call's matmul descriptor in `storage` (TN, f32 compute and scale, the scale pointers).
cublasLtMatmulDesc_t make_desc(cublasLtMatmulDescOpaque_t* storage, const OpCall* call,
                               const ops::Fp8GemmAttrs& at) {
  cublasLtMatmulDesc_t desc = storage;
  lt_check(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), kOp,
           "cublasLtMatmulDescInit");
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  // cuBLAS's A is loom's B and its B loom's A.
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
           static_cast<const void*>(call->inputs[3].data));
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
           static_cast<const void*>(call->inputs[2].data));
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(at.fast_accum != 0));
  return desc;
}

// The plan of `p`: its layouts, and the algorithm choose_algo keeps of the heuristic's list
// (its first, unless LOOM_GEMM_ALGO=measured), tried on `trial` with `desc` (this call's).
void make_plan(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const Problem& p,
               const TrialCall& trial, Plan* plan) {
  // Stored (before op) column-major shapes, ld = rows: A (k, m) op T, B (k, n) op N, C (m, n).
  const auto ta = static_cast<cudaDataType_t>(p.type_a), tb = static_cast<cudaDataType_t>(p.type_b),
             ty = static_cast<cudaDataType_t>(p.type_y);
  lt_check(cublasLtMatrixLayoutCreate(&plan->a, ta, p.k, p.m, p.k), kOp,
           "cublasLtMatrixLayoutCreate(A)");
  lt_check(cublasLtMatrixLayoutCreate(&plan->b, tb, p.k, p.n, p.k), kOp,
           "cublasLtMatrixLayoutCreate(B)");
  lt_check(cublasLtMatrixLayoutCreate(&plan->c, ty, p.m, p.n, p.m), kOp,
           "cublasLtMatrixLayoutCreate(C)");
  Preference pref(kOp, static_cast<uint32_t>(p.align_a), static_cast<uint32_t>(p.align_b),
                  static_cast<uint32_t>(p.align_c), ty);
  cublasLtMatmulHeuristicResult_t results[kMeasuredCandidates] = {};
  int count = 0;
  cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(h, desc, plan->a, plan->b, plan->c, plan->c, pref.pref,
                                     heuristic_request(kOp), results, &count);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && count == 0))
    throw Error(Code::kUnimplemented, std::string(kOp) + ": cuBLASLt has no FP8 algorithm for " +
                                          describe(p) + " (" + cublasLtGetStatusName(status) + ")");
  lt_check(status, kOp, "cublasLtMatmulAlgoGetHeuristic");
  const int pick = choose_algo(kOp, describe(p), h, desc, *plan, results, count, trial);
  plan->algo = results[pick].algo;
  plan->workspace = results[pick].workspaceSize;
}

void fp8_gemm_run(const OpCall* call) {
  const Fp8GemmShape s = op_checks::check_fp8_gemm(call, false, DeviceType::kCuda);
  if (s.m == 0 || s.n == 0) return;  // nothing to write, whatever the layout
  if (std::string why = layout_problem(s, call); !why.empty())
    throw Error(Code::kUnimplemented, why);
  const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
  const ops::Fp8GemmAttrs& at = s.attrs;
  const int device = current_device(kOp, Y);
  if (std::string why = capability_problem(device); !why.empty())
    throw Error(Code::kUnimplemented, why);
  const cudaStream_t stream = stream_of(call);
  if (s.k == 0) {
    scale_y(kOp, Y, at.beta, stream);
    return;
  }

  Problem p{};
  p.device = device;
  p.type_a = cuda_data_type(B.dtype);
  p.type_b = cuda_data_type(A.dtype);
  p.type_y = cuda_data_type(Y.dtype);
  p.fast_accum = at.fast_accum != 0;
  p.m = s.n;
  p.n = s.m;
  p.k = s.k;
  p.align_a = alignment_of(B.data, 0);
  p.align_b = alignment_of(A.data, 0);
  p.align_c = alignment_of(Y.data, 0);

  cublasLtMatmulDescOpaque_t storage;
  cublasLtMatmulDesc_t desc = make_desc(&storage, call, at);
  cublasLtHandle_t h = lt_handle(kOp, device);
  static auto* cache = new PlanCache<std::array<int64_t, 11>>();  // leaked: see resources.cuh
  const float alpha = at.alpha, beta = at.beta;
  // The call as a measured choice of algorithm would run it (LOOM_GEMM_ALGO).
  const size_t y_bytes = static_cast<size_t>(s.m * s.n) * dtype_size(Y.dtype);
  const TrialCall trial{B.data, A.data, y_bytes, &alpha, &beta, stream, device};
  PlanOwner owner;
  const Plan plan =
      cache->get(p.key(), &owner, [&](Plan* out) { make_plan(h, desc, p, trial, out); });
  Scratch ws = stream_scratch(device, stream);
  lt_check(cublasLtMatmul(h, desc, &alpha, B.data, plan.a, A.data, plan.b, &beta, Y.data, plan.c,
                          Y.data, plan.c, &plan.algo, ws.data, plan.workspace, stream),
           kOp, "cublasLtMatmul");
  mark_written(Y.data, static_cast<size_t>(s.m * s.n) * dtype_size(Y.dtype), stream);
}

bool fp8_gemm_supports(const OpCall* call) {
  Fp8GemmShape s{};
  if (!check_passes([&] { s = op_checks::check_fp8_gemm(call, true, DeviceType::kCuda); }))
    return false;
  if (s.m == 0 || s.n == 0) return true;  // an empty Y: no GEMM runs
  return check_passes([&] {
    if (!layout_problem(s, call).empty() ||
        !capability_problem(call->outputs[0].device.index).empty())
      throw 0;
  });
}

Status fp8_gemm_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    const Fp8GemmShape s = op_checks::check_fp8_gemm(call, true, DeviceType::kCuda);
    *out = io_cost(call, 2.0 * s.m * s.n * s.k);
    if (s.attrs.beta != 0.0f)  // Y is read too
      out->bytes_read += static_cast<double>(numel(call->outputs[0])) *
                         static_cast<double>(dtype_size(call->outputs[0].dtype));
  });
}

}  // namespace

void add_fp8_gemm_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kFp8Gemm, fp8_gemm_cublaslt, fp8_gemm_supports, fp8_gemm_cost,
                   {DType::kF8E4M3, DType::kF8E5M2});
}

}  // namespace gemm

Status fp8_gemm_cublaslt(const OpCall* call) {
  return guard([&] { gemm::fp8_gemm_run(call); });
}

}  // namespace loom::kernels::cuda
