// grouped_gemm and grouped_gemm_wgrad (loom/ops/moe.h) on CUDA through cuBLAS: one GEMM per
// expert over its run of rows, group g owning rows [r_g, r_g + m_g) of X, Y and dY:
//   grouped_gemm        Y[rows g] (m_g, Nd) = alpha * X[rows g] (m_g, Kd) @ op(W_g) + beta * Y
//                       W_g (Nd, Kd) when trans_b, else (Kd, Nd); a group of 0 rows is skipped
//   grouped_gemm_wgrad  dW_g (Nd, Kd) = alpha * dY[rows g]^T (Nd, m_g) @ X[rows g] (m_g, Kd)
//                       + beta * dW_g; a group of 0 rows gets beta * dW_g (zeros when beta
//                       is 0, written without reading dW_g, which may hold NaN)
//
// Layout (the reasoning of gemm/gemm.cu). A row-major (R, C) matrix read column-major with
// leading dimension C is its transpose (C, R), so a row-major product P = A @ B is computed
// as the column-major P^T = B^T A^T, each operand passed as stored:
//   grouped_gemm: Y_g^T (Nd, m_g) = op(W_g)^T (Nd, Kd) @ X_g^T (Kd, m_g), i.e. cuBLAS
//     m = Nd, n = m_g, k = Kd;
//     A = W_g  trans_b = 0: stored (Kd, Nd) = column-major (Nd, Kd), op N, lda = Nd
//              trans_b = 1: stored (Nd, Kd) = column-major (Kd, Nd), op T, lda = Kd
//     B = X_g  stored (m_g, Kd) = column-major (Kd, m_g), op N, ldb = Kd
//     C = Y_g  stored (m_g, Nd) = column-major (Nd, m_g), ldc = Nd
//   grouped_gemm_wgrad: dW_g^T (Kd, Nd) = X_g^T (Kd, m_g) @ dY_g (m_g, Nd), i.e. cuBLAS
//     m = Kd, n = Nd, k = m_g;
//     A = X_g   stored (m_g, Kd) = column-major (Kd, m_g), op N, lda = Kd
//     B = dY_g  stored (m_g, Nd) = column-major (Nd, m_g), op T (gives (m_g, Nd)), ldb = Nd
//     C = dW_g  stored (Nd, Kd) = column-major (Kd, Nd), ldc = Kd
// A group's rows start r_g * Kd (X), r_g * Nd (Y, dY) elements into their tensors.
//
// Precision: cublasGemmEx with CUBLAS_COMPUTE_32F for every dtype: f32 operands in full f32
// (no TF32), bf16 / f16 on tensor cores with f32 accumulation; the output in the operands'
// dtype or in f32 (the weight gradients). cuBLAS has no A and B of different dtypes, and no
// output in the other 16-bit dtype: `supports` declines those calls, and extents past int32.
// Kd == 0 is an empty sum: grouped_gemm writes Y = beta * Y.
//
// State: one cuBLAS handle per device (created on first use, never destroyed: see
// common/resources.cuh), used under its own mutex since a handle holds one stream and one
// workspace at a time; each call binds it to the call's stream with that stream's 32 MiB
// scratch as workspace (common/resources.cuh: ops on a stream run in order, so they share
// it safely). cublasGemmEx takes any alignment and any m_g without a per-shape plan, which
// suits the varying group sizes; the groups run one call each, in group order, on the
// call's stream (cublasGemmGroupedBatchedEx would save the host's launch loop but needs the
// pointer arrays in device memory).
#include <cublas_v2.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/moe.h>

#include <climits>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/dtype.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/moe/registry.cuh"

namespace loom::kernels::cuda::moe {
namespace {

using op_checks::GroupedGemmShape;

void blas_check(cublasStatus_t status, const char* op, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  Code code = Code::kInternal;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) code = Code::kResourceExhausted;
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) code = Code::kUnimplemented;
  throw Error(code, std::string(op) + ": " + what + " failed: " + cublasGetStatusName(status) +
                        ": " + cublasGetStatusString(status));
}

struct DeviceBlas {
  cublasHandle_t handle = nullptr;
  std::mutex mutex;
};

DeviceBlas& device_blas(const char* op, int device) {
  static std::mutex mutex;
  static auto* all = new std::map<int, DeviceBlas*>();  // leaked: see common/resources.cuh
  std::lock_guard<std::mutex> lock(mutex);
  auto it = all->find(device);
  if (it != all->end()) return *it->second;
  cublasHandle_t h = nullptr;
  blas_check(cublasCreate(&h), op, "cublasCreate");  // on the current device, `device`
  auto* b = new DeviceBlas();
  b->handle = h;
  (*all)[device] = b;
  return *b;
}

// The device's handle, held (under its mutex) and bound to the call's stream and scratch for
// the session's scope.
class BlasSession {
 public:
  BlasSession(const char* op, int device, cudaStream_t stream)
      : blas_(device_blas(op, device)), lock_(blas_.mutex) {
    Scratch ws = stream_scratch(device, stream);
    blas_check(cublasSetStream(blas_.handle, stream), op, "cublasSetStream");
    // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
    blas_check(cublasSetWorkspace(blas_.handle, ws.data, ws.bytes), op, "cublasSetWorkspace");
  }
  cublasHandle_t handle() const { return blas_.handle; }

 private:
  DeviceBlas& blas_;
  std::lock_guard<std::mutex> lock_;
};

cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// What cublasGemmEx runs with CUBLAS_COMPUTE_32F (see the file comment); throws otherwise.
void check_blas_call(const char* op, const GroupedGemmShape& s, const TensorView& a,
                     const char* a_name, const TensorView& b, const char* b_name,
                     const TensorView& out, const char* out_name) {
  if (a.dtype != b.dtype)
    throw Error(Code::kInvalidArgument,
                std::string(op) + ": " + a_name + " is " + dtype_name(a.dtype) + " and " + b_name +
                    " is " + dtype_name(b.dtype) +
                    ": the CUDA grouped GEMMs take operands of one dtype (cast one of them first)");
  if (out.dtype != a.dtype && out.dtype != DType::kF32)
    throw Error(Code::kInvalidArgument, std::string(op) + ": " + out_name + " is " +
                                            dtype_name(out.dtype) + " with " + dtype_name(a.dtype) +
                                            " operands: the CUDA grouped GEMMs write it in the "
                                            "operands' dtype or in f32");
  if (s.m > INT_MAX || s.n > INT_MAX || s.k > INT_MAX)
    throw Error(Code::kUnimplemented, std::string(op) + ": (M, Nd, Kd) = (" + std::to_string(s.m) +
                                          ", " + std::to_string(s.n) + ", " + std::to_string(s.k) +
                                          ") exceeds cuBLAS's int32 extents");
}

template <class T>
__global__ void scale_kernel(T* __restrict__ p, int64_t n, float beta) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = from_f32<T>(beta * to_f32<T>(p[i]));
}

// p[0, count) = beta * p: nothing for beta 1, a memset for beta 0 (zero bits are +0 in every
// float dtype; p is not read, so a NaN there does not survive).
void scale(const char* op, void* p, DType dt, int64_t count, float beta, cudaStream_t stream) {
  if (beta == 1.0f || count == 0) return;
  if (beta == 0.0f) {
    cuda_check(cudaMemsetAsync(p, 0, static_cast<size_t>(count) * dtype_size(dt), stream),
               "cudaMemsetAsync (grouped GEMM output)");
    return;
  }
  LOOM_CUDA_FLOAT_SWITCH(dt, T, op, {
    scale_kernel<T>
        <<<grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<T*>(p), count, beta);
  });
  launch_check(op);
}

// ---- grouped_gemm -------------------------------------------------------------------------

GroupedGemmShape check_fwd(const OpCall* call, bool shapes_only) {
  GroupedGemmShape s = op_checks::check_grouped_gemm(call, shapes_only, DeviceType::kCuda);
  check_blas_call(ops::kGroupedGemm, s, call->inputs[0], "X", call->inputs[1], "W",
                  call->outputs[0], "Y");
  return s;
}

void grouped_gemm_run(const OpCall* call) {
  constexpr const char* kOp = ops::kGroupedGemm;
  GroupedGemmShape s = check_fwd(call, false);
  // The W_g have W_0's dtype and shape (the contract), which the checks have seen.
  const TensorView &X = call->inputs[0], &Y = call->outputs[0];
  const ops::GroupedGemmAttrs& at = s.attrs;
  if (s.m == 0 || s.n == 0) return;
  const int device = current_device(kOp, Y);
  cudaStream_t stream = stream_of(call);
  if (s.k == 0) {  // every row belongs to a group: all of Y is beta * Y
    scale(kOp, Y.data, Y.dtype, s.m * s.n, at.beta, stream);
    return;
  }
  const int64_t xb = static_cast<int64_t>(dtype_size(X.dtype));
  const int64_t yb = static_cast<int64_t>(dtype_size(Y.dtype));
  const cudaDataType_t ab = blas_type(X.dtype), yt = blas_type(Y.dtype);
  const int n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  const float alpha = at.alpha, beta = at.beta;
  BlasSession blas(kOp, device, stream);
  int64_t row = 0;  // r_g
  for (int32_t g = 0; g < at.groups; ++g) {
    const int64_t m_g = at.group_rows[g];
    if (m_g == 0) continue;
    const char* x = static_cast<const char*>(X.data) + row * s.k * xb;
    char* y = static_cast<char*>(Y.data) + row * s.n * yb;
    blas_check(cublasGemmEx(blas.handle(), at.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n,
                            static_cast<int>(m_g), k, &alpha, at.weights[g], ab, at.trans_b ? k : n,
                            x, ab, k, &beta, y, yt, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               kOp, "cublasGemmEx");
    row += m_g;
  }
}

Status grouped_gemm(const OpCall* call) {
  return guard([&] { grouped_gemm_run(call); });
}

bool grouped_gemm_supports(const OpCall* call) {
  return check_passes([&] { check_fwd(call, true); });
}

// The cost every kernel library reports (loom/cpp/op_checks/moe.h).
Status grouped_gemm_cost(const OpCall* call, OpCost* out) {
  return guard([&] { *out = op_checks::grouped_gemm_cost(call, check_fwd(call, true)); });
}

// ---- grouped_gemm_wgrad -------------------------------------------------------------------

GroupedGemmShape check_wgrad(const OpCall* call, bool shapes_only) {
  GroupedGemmShape s = op_checks::check_grouped_gemm_wgrad(call, shapes_only, DeviceType::kCuda);
  check_blas_call(ops::kGroupedGemmWgrad, s, call->inputs[0], "dY", call->inputs[1], "X",
                  call->outputs[0], "dW");
  return s;
}

void grouped_gemm_wgrad_run(const OpCall* call) {
  constexpr const char* kOp = ops::kGroupedGemmWgrad;
  GroupedGemmShape s = check_wgrad(call, false);
  const TensorView &dY = call->inputs[0], &X = call->inputs[1], &dW = call->outputs[0];
  const ops::GroupedGemmAttrs& at = s.attrs;
  if (s.n == 0 || s.k == 0) return;  // every dW_g is empty
  const int device = current_device(kOp, dW);
  cudaStream_t stream = stream_of(call);
  const int64_t xb = static_cast<int64_t>(dtype_size(X.dtype));
  const int64_t yb = static_cast<int64_t>(dtype_size(dY.dtype));
  const cudaDataType_t ab = blas_type(X.dtype), wt = blas_type(dW.dtype);
  const int n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  const float alpha = at.alpha, beta = at.beta;
  BlasSession blas(kOp, device, stream);
  int64_t row = 0;  // r_g
  for (int32_t g = 0; g < at.groups; ++g) {
    const int64_t m_g = at.group_rows[g];
    if (m_g == 0) {  // an empty sum: beta * dW_g, never a stale gradient
      scale(kOp, at.weights[g], dW.dtype, s.n * s.k, beta, stream);
      continue;
    }
    const char* x = static_cast<const char*>(X.data) + row * s.k * xb;
    const char* dy = static_cast<const char*>(dY.data) + row * s.n * yb;
    blas_check(cublasGemmEx(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_T, k, n, static_cast<int>(m_g),
                            &alpha, x, ab, k, dy, ab, n, &beta, at.weights[g], wt, k,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               kOp, "cublasGemmEx");
    row += m_g;
  }
}

Status grouped_gemm_wgrad(const OpCall* call) {
  return guard([&] { grouped_gemm_wgrad_run(call); });
}

bool grouped_gemm_wgrad_supports(const OpCall* call) {
  return check_passes([&] { check_wgrad(call, true); });
}

// The cost every kernel library reports (loom/cpp/op_checks/moe.h).
Status grouped_gemm_wgrad_cost(const OpCall* call, OpCost* out) {
  return guard([&] { *out = op_checks::grouped_gemm_wgrad_cost(call, check_wgrad(call, true)); });
}

}  // namespace

void add_grouped_gemm_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kGroupedGemm, grouped_gemm, grouped_gemm_supports, grouped_gemm_cost);
  add_cuda_kernels(out, ops::kGroupedGemmWgrad, grouped_gemm_wgrad, grouped_gemm_wgrad_supports,
                   grouped_gemm_wgrad_cost);
}

}  // namespace loom::kernels::cuda::moe
