// gemm_epilogue (loom/ops.h) on CUDA: one cuBLASLt matmul whose epilogue adds the bias,
// applies GELU (keeping its input for backward), applies GELU's derivative, or reduces the
// bias gradient, instead of the separate memory-bound kernels that would read and write Y
// again (Transformer Engine's gemm with bias / gelu / grad does the same).
//
// Layout: as gemm.cu, cuBLAS sees the row-major problem transposed: its (m, n, k) is loom's
// (N, M, K), its A is loom's B and its B loom's A, and its D (m, n) column-major is loom's Y
// (M, N) row-major. So:
//   - a bias over loom's columns (N) is a vector over cuBLAS's rows: CUBLASLT_EPILOGUE_BIAS,
//     and DGELU_BGRAD's bias gradient (the column sums of loom's Y) is over those rows too;
//   - the GELU input matrix (aux) is loom's P (M, N) row-major = cuBLAS (N, M) column-major,
//     leading dimension N (cuBLASLt wants a multiple of 8);
//   - kEpilogueBiasGradA's dbias (M), the row sums of op(A) over K, is BGRADB: cuBLAS's B is
//     loom's A, the vector is over cuBLAS's columns (loom's M), reduced over k.
//
// Epilogues:
//   kEpilogueBias                 BIAS
//   kEpilogueGelu, tanh           GELU[_AUX][_BIAS] (cuBLASLt's GELU is the tanh form; bf16
//                                 and f16 only: f32 runs the unfused kernels below)
//   kEpilogueGelu, erf            BIAS into P, then gelu_fwd (cuBLASLt has no erf GELU)
//   kEpilogueDGelu, tanh          bf16: DGELU, then bias_grad (see dgelu_mode); f16 and f32:
//                                 the unfused kernels
//   kEpilogueBiasGradA            BGRADB (DEFAULT without dbias)
// A bias gradient comes out of cuBLASLt in Y's dtype and overwrites its vector, while loom's
// dbias is f32 and accumulates: cuBLASLt writes it into the upper half of the stream scratch
// (the lower half is its workspace), and a small kernel adds it to dbias.
//
// Fallback: whatever cuBLASLt has no algorithm for (an epilogue on a dtype or alignment it
// does not cover, N not a multiple of 8 with an aux matrix, a bias gradient larger than half
// the scratch, K == 0, erf's derivative) runs the unfused sequence of the library's own
// kernels (gemm, bias_add, gelu_fwd / gelu_bwd, bias_grad), which the contract allows. The
// decision is cached per problem with its plan; a matmul that cuBLASLt refuses at run time
// after its heuristic offered an algorithm joins the fallback too (said once on stderr).
//
// Kernel "cuda.tf32x3" (f32 only, priority 16: a spec pins it, with gemm's of the same name)
// runs its GEMM in 3xTF32 (gemm_tf32x3.cu): f32 accuracy on TF32 tensor cores. In registers
// (the default form) the GEMM's own epilogue adds the bias and applies GELU (writing P when
// the call keeps it) or GELU's derivative, in f32 with gelu.cu's arithmetic: no workspace, and
// for kEpilogueBiasGradA and kEpilogueDGelu's dbias loom's bias_grad after it. In the split
// form (LOOM_TF32X3=split|one|two), and for K == 0, it runs the unfused sequence with the
// bias added in the GEMM's last matmul; its workspace is then P's (as above), then the split
// operands.
#include <cublasLt.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/gemm.h>
#include <loom/cpp/tensor.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/gemm/cublaslt.cuh"
#include "kernels/cuda/gemm/registry.cuh"
#include "kernels/cuda/gemm/tf32x3_gemm.cuh"
#include "kernels/cuda/pointwise/pointwise.h"

namespace loom::kernels::cuda::gemm {
namespace {

using op_checks::GemmEpilogueShape;
constexpr const char* kOp = ops::kGemmEpilogue;

// The scratch is split: cuBLASLt's workspace below, a bias gradient vector above.
constexpr size_t kWorkspaceBytes = kScratchBytes / 2;

// ---- The unfused sequence ------------------------------------------------------------

// The "cuda" kernel of `op` keyed on `dtype` from the families this op composes.
const KernelDesc& family_kernel(const char* op, DType dtype) {
  static const std::vector<KernelDesc>* list = [] {
    auto* v = new std::vector<KernelDesc>();  // leaked, as the plan caches
    add_gemm_op_kernels(*v);
    add_elementwise_kernels(*v);
    add_pointwise_kernels(*v);
    return v;
  }();
  for (const KernelDesc& k : *list)
    if (std::strcmp(k.op, op) == 0 && k.dtype == dtype && std::strcmp(k.name, kCudaName) == 0)
      return k;
  throw Error(Code::kInternal, std::string(kOp) + ": no CUDA kernel for " + op);
}

// Runs one op of the sequence on the call's stream.
template <class Attrs>
void run_step(const OpCall* call, const char* op, DType key, std::vector<TensorView> inputs,
              std::vector<TensorView> outputs, const Attrs* attrs) {
  OpCall c{sizeof(OpCall),
           inputs.data(),
           static_cast<int32_t>(inputs.size()),
           outputs.data(),
           static_cast<int32_t>(outputs.size()),
           attrs,
           attrs ? sizeof(Attrs) : 0,
           call->stream,
           nullptr,
           0};
  throw_if_error(family_kernel(op, key).fn(&c));
}

// Where the unfused sequence's GEMM runs: the family's "cuda" gemm, or (kernel "cuda.tf32x3")
// 3xTF32 in `workspace`, which then adds the bias in its last matmul's epilogue; or, in
// registers, 3xTF32 with the activation in its epilogue too.
struct GemmStep {
  bool tf32x3 = false;
  void* workspace = nullptr;
  size_t bytes = 0;
  bool in_registers = false;  // tf32x3 in registers, K > 0: GELU and its derivative fused
};

// The 3xTF32 problem of a gemm_epilogue call.
Tf32x3Shape tf32x3_shape(const GemmEpilogueShape& s) {
  Tf32x3Shape t;
  t.m = s.m;
  t.n = s.n;
  t.k = s.k;
  t.trans_a = s.attrs.trans_a != 0;
  t.trans_b = s.attrs.trans_b != 0;
  return t;
}

// The unfused sequence (the CPU kernels' file comment lists it); `P` is the gelu input
// buffer (the aux output or the call's workspace) for kEpilogueGelu.
void run_unfused(const OpCall* call, const GemmEpilogueShape& s, const TensorView& P,
                 const GemmStep& step = {}) {
  const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
  const ops::GemmEpilogueAttrs& at = s.attrs;
  const DType dt = A.dtype;
  const ops::GeluAttrs gelu{at.approximate};
  const ops::GemmAttrs g{at.trans_a, at.trans_b, 1.f,
                         at.epilogue == ops::kEpilogueBiasGradA ? at.beta : 0.f};
  // The GEMM into `out`, adding `bias` when given (bias_add unless the GEMM added it), and in
  // registers applying `act` in its epilogue.
  auto gemm = [&](const TensorView& out, const TensorView* bias, const Tf32x3Activation& act = {}) {
    if (step.tf32x3) {
      const bool fuse = bias != nullptr && s.k > 0;  // an empty sum takes no epilogue
      run_tf32x3(kOp, tf32x3_shape(s), static_cast<const float*>(A.data),
                 static_cast<const float*>(B.data), static_cast<float*>(out.data), 1.f, g.beta,
                 fuse ? static_cast<const float*>(bias->data) : nullptr, step.workspace, step.bytes,
                 stream_of(call), current_device(kOp, out), act);
      if (fuse) return;
    } else {
      run_step(call, ops::kGemm, dt, {A, B}, {out}, &g);
    }
    if (bias != nullptr) run_step<int>(call, ops::kBiasAdd, out.dtype, {*bias}, {out}, nullptr);
  };
  Tf32x3Activation act;  // in registers: the activation of the GEMM's epilogue
  act.tanh = at.approximate != 0;
  switch (at.epilogue) {
    case ops::kEpilogueBias:
      gemm(Y, &call->inputs[2]);
      return;
    case ops::kEpilogueGelu:
      if (step.in_registers) {
        act.kind = Tf32x3Activation::kGelu;
        act.aux = s.aux_out ? static_cast<float*>(P.data) : nullptr;
        gemm(Y, s.bias ? &call->inputs[2] : nullptr, act);
        return;
      }
      gemm(P, s.bias ? &call->inputs[2] : nullptr);
      run_step(call, ops::kGeluFwd, dt, {P}, {Y}, &gelu);
      return;
    case ops::kEpilogueDGelu:
      if (step.in_registers) {
        act.kind = Tf32x3Activation::kDGelu;
        act.p = static_cast<const float*>(call->inputs[3].data);
        gemm(Y, nullptr, act);
      } else {
        gemm(Y, nullptr);
        run_step(call, ops::kGeluBwd, dt, {Y, call->inputs[3]}, {Y}, &gelu);
      }
      if (s.dbias) run_step<int>(call, ops::kBiasGrad, dt, {Y}, {call->outputs[2]}, nullptr);
      return;
    case ops::kEpilogueBiasGradA:
      gemm(Y, nullptr);
      if (!s.dbias) return;
      if (!at.trans_a)
        throw Error(Code::kUnimplemented,
                    std::string(kOp) +
                        ": kEpilogueBiasGradA with A stored (M, K) (trans_a 0) has no CUDA "
                        "kernel when cuBLASLt declines it; pass dY stored (N, M) with trans_a 1, "
                        "as a weight gradient does");
      run_step<int>(call, ops::kBiasGrad, dt, {A}, {call->outputs[2]}, nullptr);
      return;
  }
}

// ---- The fused matmul ----------------------------------------------------------------

// One fused problem in cuBLAS's terms (see the file comment); epilogue is cuBLASLt's.
struct Problem {
  int64_t device, ab_type, y_type, epilogue, beta;
  int64_t op_a, op_b;  // cublasOperation_t of cuBLAS's A (loom B) and B (loom A)
  int64_t m, n, k;     // loom's N, M, K
  int64_t align_a, align_b, align_c, align_bias, align_aux;  // bytes
  std::array<int64_t, 15> key() const {
    return {device, ab_type, y_type,  epilogue, beta,    op_a,       op_b,     m,
            n,      k,       align_a, align_b,  align_c, align_bias, align_aux};
  }
};

// The call's matmul descriptor in `storage`: transposes, the epilogue and its pointers.
cublasLtMatmulDesc_t make_desc(cublasLtMatmulDescOpaque_t* storage, const Problem& p,
                               const void* bias, const void* aux) {
  cublasLtMatmulDesc_t desc = storage;
  lt_check(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), kOp,
           "cublasLtMatmulDescInit");
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<cublasOperation_t>(p.op_a));
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<cublasOperation_t>(p.op_b));
  set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<cublasLtEpilogue_t>(p.epilogue));
  if (bias != nullptr) {
    set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    // A bias, and a bias gradient, in Y's type (the only type cuBLASLt's bias gradients
    // take outside FP8).
    set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(p.y_type));
  }
  if (aux != nullptr) {
    set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set_desc(kOp, desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.m);
  }
  return desc;
}

// Fills `plan` (layouts, algorithm); leaves plan->a null when cuBLASLt has no algorithm. The
// algorithm is the heuristic's first, or under LOOM_GEMM_ALGO=measured the one choose_algo
// keeps, tried on `trial` with `desc` (this call's: the trial runs write its bias gradient
// into the stream scratch and its GELU aux output into the call's, which the call itself
// then writes again).
void make_plan(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const Problem& p,
               const TrialCall& trial, Plan* plan) {
  auto op_a = static_cast<cublasOperation_t>(p.op_a), op_b = static_cast<cublasOperation_t>(p.op_b);
  auto ab = static_cast<cudaDataType_t>(p.ab_type), y = static_cast<cudaDataType_t>(p.y_type);
  make_layouts(kOp, op_a, op_b, ab, y, p.m, p.n, p.k, plan);
  Preference pref(kOp, static_cast<uint32_t>(p.align_a), static_cast<uint32_t>(p.align_b),
                  static_cast<uint32_t>(p.align_c), y, kWorkspaceBytes);
  cublasLtMatmulHeuristicResult_t results[kMeasuredCandidates] = {};
  int count = 0;
  cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(h, desc, plan->a, plan->b, plan->c, plan->c, pref.pref,
                                     heuristic_request(kOp), results, &count);
  if (status == CUBLAS_STATUS_SUCCESS && count > 0) {
    const int pick = choose_algo(
        kOp,
        "(cuBLAS m = " + std::to_string(p.m) + ", n = " + std::to_string(p.n) +
            ", k = " + std::to_string(p.k) + ", epilogue " + std::to_string(p.epilogue) + ")",
        h, desc, *plan, results, count, trial);
    plan->algo = results[pick].algo;
    plan->workspace = results[pick].workspaceSize;
    return;
  }
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
    lt_check(status, kOp, "cublasLtMatmulAlgoGetHeuristic");
  // No algorithm: an empty plan, cached too, so the next call falls back at once.
  cublasLtMatrixLayoutDestroy(plan->a);
  cublasLtMatrixLayoutDestroy(plan->b);
  cublasLtMatrixLayoutDestroy(plan->c);
  plan->a = plan->b = plan->c = nullptr;
}

// Problems whose fused matmul cuBLASLt refused at run time (run_fused), for the process.
std::mutex g_refused_mutex;
std::set<std::array<int64_t, 15>>* g_refused = new std::set<std::array<int64_t, 15>>();  // leaked

bool refused(const Problem& p) {
  std::lock_guard<std::mutex> lock(g_refused_mutex);
  return g_refused->count(p.key()) > 0;
}

void refuse(const Problem& p, cublasStatus_t status) {
  std::lock_guard<std::mutex> lock(g_refused_mutex);
  if (!g_refused->insert(p.key()).second) return;
  std::fprintf(stderr,
               "loom: gemm_epilogue: cuBLASLt refused epilogue %lld on (cuBLAS m = %lld, n = %lld, "
               "k = %lld) with %s; this problem runs the unfused kernels\n",
               static_cast<long long>(p.epilogue), static_cast<long long>(p.m),
               static_cast<long long>(p.n), static_cast<long long>(p.k),
               cublasLtGetStatusName(status));
}

// dbias[i] += float(grad[i]): cuBLASLt's bias gradient (Y's type) into loom's f32 sum.
template <class T>
__global__ void accumulate_kernel(const T* __restrict__ grad, float* __restrict__ dbias,
                                  int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dbias[i] += to_f32<T>(grad[i]);
}

// How kEpilogueDGelu runs in bf16 (f16 and f32 always run loom's kernels: cuBLASLt's
// derivative missed f16's tolerance by up to 2x on an H200, 2026-11-27, while bf16's
// rounding covers it), from the environment variable LOOM_CUBLASLT_DGELU (read once):
//   dgelu (default)  cuBLASLt's DGELU, then loom's bias_grad of Y: GPT-2 124M trained at
//                    510K tokens/s on the H200 against 488K with loom's kernels;
//   unfused          gemm, gelu_bwd, bias_grad: loom's kernels;
//   dgelu_bgrad      cuBLASLt's DGELU_BGRAD in one call: 472K tokens/s (a plain GEMM, then
//                    a separate epilogue kernel of 0.62 ms per layer).
// A switch for measuring the three on a GPU (tools/gpu_bundle_run.sh), not a tuning knob.
enum class DGeluMode { kUnfused, kDGelu, kDGeluBgrad };
DGeluMode dgelu_mode() {
  static const DGeluMode mode = [] {
    switch (env_choice(kOp, "LOOM_CUBLASLT_DGELU", {"dgelu", "unfused", "dgelu_bgrad"})) {
      case 1:
        return DGeluMode::kUnfused;
      case 2:
        return DGeluMode::kDGeluBgrad;
      default:
        return DGeluMode::kDGelu;
    }
  }();
  return mode;
}

// cuBLASLt's epilogue for the call (of dtype dt), or 0 when the call has none (erf's
// derivative; the tanh derivative outside bf16 or in the unfused mode).
int64_t lt_epilogue(const GemmEpilogueShape& s, DType dt) {
  const bool tanh = s.attrs.approximate != 0;
  switch (s.attrs.epilogue) {
    case ops::kEpilogueBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case ops::kEpilogueGelu:
      if (!tanh) return CUBLASLT_EPILOGUE_BIAS;  // into P; gelu_fwd follows
      if (s.aux_out) return s.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      return s.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case ops::kEpilogueDGelu:
      if (!tanh || dt != DType::kBF16 || dgelu_mode() == DGeluMode::kUnfused) return 0;
      return s.dbias && dgelu_mode() == DGeluMode::kDGeluBgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                                               : CUBLASLT_EPILOGUE_DGELU;
    case ops::kEpilogueBiasGradA:
      return s.dbias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
  }
  return 0;
}

// Runs the call as one fused matmul (plus, for erf's GELU, gelu_fwd on P); false when
// cuBLASLt cannot, and nothing has been written then.
bool run_fused(const OpCall* call, const GemmEpilogueShape& s, const TensorView& P) {
  const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
  const ops::GemmEpilogueAttrs& at = s.attrs;
  const int64_t epilogue = lt_epilogue(s, A.dtype);
  if (epilogue == 0 || s.k == 0) return false;
  const bool erf_gelu = at.epilogue == ops::kEpilogueGelu && at.approximate == 0;
  // Where cuBLASLt writes D: P for erf's GELU (bias only), else Y.
  const TensorView& D = erf_gelu ? P : Y;
  const bool bias_in =
      s.bias && (at.epilogue == ops::kEpilogueBias || at.epilogue == ops::kEpilogueGelu);
  // The bias gradient from cuBLASLt (BGRAD epilogues), or from loom's bias_grad after it
  // (kEpilogueDGelu with the plain DGELU epilogue).
  const bool grad_out = s.dbias && epilogue != CUBLASLT_EPILOGUE_DGELU;
  const bool grad_after = s.dbias && epilogue == CUBLASLT_EPILOGUE_DGELU;
  const bool has_aux = (at.epilogue == ops::kEpilogueGelu && !erf_gelu && s.aux_out) ||
                       at.epilogue == ops::kEpilogueDGelu;
  if (erf_gelu && !s.bias) return false;  // a plain gemm into P: the unfused path is that
  // cuBLASLt's GELU and its derivative only for 16-bit outputs, whose rounding (2^-9 for
  // bf16) hides how its tanh is evaluated; f32 keeps loom's own kernels, accurate to f32.
  const bool gelu_math =
      (at.epilogue == ops::kEpilogueGelu && !erf_gelu) || at.epilogue == ops::kEpilogueDGelu;
  if (gelu_math && A.dtype == DType::kF32) return false;
  if (has_aux && s.n % 8 != 0) return false;  // cuBLASLt's aux leading dimension
  const int64_t grad_len = at.epilogue == ops::kEpilogueDGelu ? s.n : s.m;
  const size_t grad_bytes = grad_out ? static_cast<size_t>(grad_len) * dtype_size(D.dtype) : 0;
  if (grad_bytes > kScratchBytes - kWorkspaceBytes) return false;

  const int device = current_device(kOp, Y);
  const cudaStream_t stream = stream_of(call);
  Scratch scratch = stream_scratch(device, stream);
  void* grad = static_cast<char*>(scratch.data) + kWorkspaceBytes;
  const void* bias = bias_in ? call->inputs[2].data : grad_out ? grad : nullptr;
  void* aux = at.epilogue == ops::kEpilogueDGelu ? call->inputs[3].data
              : has_aux                          ? call->outputs[1].data
                                                 : nullptr;

  Problem p{};
  p.device = device;
  p.ab_type = cuda_data_type(A.dtype);
  p.y_type = cuda_data_type(D.dtype);
  p.epilogue = epilogue;
  p.beta = at.beta != 0.0f;
  p.op_a = at.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.op_b = at.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.m = s.n;
  p.n = s.m;
  p.k = s.k;
  p.align_a = alignment_of(B.data, 0);
  p.align_b = alignment_of(A.data, 0);
  p.align_c = alignment_of(D.data, 0);
  p.align_bias = bias != nullptr ? alignment_of(bias, 0) : 0;
  p.align_aux = aux != nullptr ? alignment_of(aux, 0) : 0;

  cublasLtMatmulDescOpaque_t storage;
  cublasLtMatmulDesc_t desc = make_desc(&storage, p, bias, aux);
  cublasLtHandle_t h = lt_handle(kOp, device);
  static auto* cache = new PlanCache<std::array<int64_t, 15>>();  // leaked: see resources.cuh
  const float alpha = 1.0f, beta = at.beta;
  // The call as a measured choice of algorithm would run it (LOOM_GEMM_ALGO).
  const size_t y_bytes = static_cast<size_t>(s.m * s.n) * dtype_size(D.dtype);
  const TrialCall trial{B.data, A.data, y_bytes, &alpha, &beta, stream, device};
  PlanOwner owner;
  const Plan plan =
      cache->get(p.key(), &owner, [&](Plan* out) { make_plan(h, desc, p, trial, out); });
  if (plan.a == nullptr || refused(p)) return false;
  const cublasStatus_t status =
      cublasLtMatmul(h, desc, &alpha, B.data, plan.a, A.data, plan.b, &beta, D.data, plan.c, D.data,
                     plan.c, &plan.algo, scratch.data, plan.workspace, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    // The heuristic offered an algorithm that the matmul then refused (it checks the
    // arguments before launching anything): the unfused kernels take this problem from now
    // on, and stderr says so once.
    refuse(p, status);
    return false;
  }
  lt_check(status, kOp, "cublasLtMatmul");
  mark_written(D.data, static_cast<size_t>(s.m * s.n) * dtype_size(D.dtype), stream);
  if (has_aux && at.epilogue == ops::kEpilogueGelu)
    mark_written(aux, static_cast<size_t>(s.m * s.n) * dtype_size(D.dtype), stream);
  if (grad_out) {
    mark_written(grad, grad_bytes, stream);
    float* dbias = static_cast<float*>(call->outputs[2].data);
    LOOM_CUDA_FLOAT_SWITCH(D.dtype, T, kOp, {
      accumulate_kernel<T><<<grid_for(grad_len, kThreads), kThreads, 0, stream>>>(
          static_cast<const T*>(grad), dbias, grad_len);
    });
    launch_check(kOp);
  }
  if (grad_after) run_step<int>(call, ops::kBiasGrad, Y.dtype, {Y}, {call->outputs[2]}, nullptr);
  if (erf_gelu) {
    const ops::GeluAttrs gelu{0};
    run_step(call, ops::kGeluFwd, A.dtype, {P}, {Y}, &gelu);
  }
  return true;
}

// kEpilogueGelu's P when the call has no aux output: the first bytes of the workspace.
size_t p_bytes(const GemmEpilogueShape& s, DType dt) {
  if (s.attrs.epilogue != ops::kEpilogueGelu || s.aux_out) return 0;
  return static_cast<size_t>(s.m * s.n) * dtype_size(dt);
}

// Where the 3xTF32 split operands start in the workspace: after P, at 256 bytes.
size_t tf32x3_offset(const GemmEpilogueShape& s, DType dt) {
  return static_cast<size_t>(round_up(static_cast<int64_t>(p_bytes(s, dt)), 256));
}

void gemm_epilogue_run(const OpCall* call, bool tf32x3) {
  const GemmEpilogueShape s = op_checks::check_gemm_epilogue(call, false, DeviceType::kCuda);
  const DType dt = call->inputs[0].dtype;
  if (tf32x3 && dt != DType::kF32)
    throw Error(Code::kInvalidArgument,
                std::string(kOp) + ": cuda.tf32x3 takes f32 operands and was given " +
                    dtype_name(dt) + " (bf16 and f16 run on tensor cores in 'cuda')");
  if (s.m == 0 || s.n == 0) return;  // Y empty; dbias gets sums over nothing
  // 3xTF32 in registers: GELU and its derivative in the GEMM's epilogue, no P to keep.
  const bool in_registers = tf32x3 && s.k > 0 && tf32x3_in_registers(tf32x3_shape(s));
  // kEpilogueGelu's P: the aux output, or the workspace this kernel asked for.
  TensorView P = call->outputs[1];
  if (p_bytes(s, dt) > 0 && !in_registers) {
    if (call->workspace == nullptr || call->workspace_bytes < p_bytes(s, dt))
      throw Error(Code::kInvalidArgument,
                  std::string(kOp) +
                      ": kEpilogueGelu without an aux output needs the workspace "
                      "the kernel declares (call it through loom::Kernel)");
    P = make_view(call->workspace, dt, {s.m, s.n}, call->outputs[0].device);
  }
  if (tf32x3) {
    GemmStep step{true, nullptr, 0, in_registers};
    const size_t off = tf32x3_offset(s, dt);
    if (call->workspace != nullptr && call->workspace_bytes > off) {
      step.workspace = static_cast<char*>(call->workspace) + off;
      step.bytes = call->workspace_bytes - off;
    }
    run_unfused(call, s, P, step);
    return;
  }
  if (!run_fused(call, s, P)) run_unfused(call, s, P);
}

Status gemm_epilogue(const OpCall* call) {
  return guard([&] { gemm_epilogue_run(call, false); });
}

Status gemm_epilogue_tf32x3(const OpCall* call) {
  return guard([&] { gemm_epilogue_run(call, true); });
}

// Declines kEpilogueBiasGradA's dbias with A stored (M, K): its fallback sums the columns of
// a stored (K, M) dY (bias_grad); a weight gradient always passes that.
bool gemm_epilogue_supports(const OpCall* call) {
  return check_passes([&] {
    const GemmEpilogueShape s = op_checks::check_gemm_epilogue(call, true, DeviceType::kCuda);
    if (s.attrs.epilogue == ops::kEpilogueBiasGradA && s.dbias && !s.attrs.trans_a) throw 0;
  });
}

Status gemm_epilogue_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    const GemmEpilogueShape s = op_checks::check_gemm_epilogue(call, true, DeviceType::kCuda);
    *out = io_cost(call, 2.0 * s.m * s.n * s.k);
    if (s.attrs.beta != 0.0f)  // Y is read too
      out->bytes_read += static_cast<double>(numel(call->outputs[0])) *
                         static_cast<double>(dtype_size(call->outputs[0].dtype));
  });
}

// kEpilogueGelu without an aux output keeps P in the workspace.
uint64_t gemm_epilogue_workspace(const OpCall* call) {
  GemmEpilogueShape s{};
  if (!check_passes([&] { s = op_checks::check_gemm_epilogue(call, true, DeviceType::kCuda); }))
    return 0;
  return p_bytes(s, call->inputs[0].dtype);
}

// f32 only: everything else runs in 'cuda'.
bool gemm_epilogue_tf32x3_supports(const OpCall* call) {
  return call->num_inputs > 0 && call->inputs[0].dtype == DType::kF32 &&
         gemm_epilogue_supports(call);
}

// In registers none (the epilogue runs in the GEMM); else P (as 'cuda'), then the split
// operands at 256 bytes.
uint64_t gemm_epilogue_tf32x3_workspace(const OpCall* call) {
  GemmEpilogueShape s{};
  bool in_registers = false;
  if (!check_passes([&] {
        s = op_checks::check_gemm_epilogue(call, true, DeviceType::kCuda);
        in_registers = tf32x3_in_registers(tf32x3_shape(s));
      }))
    return 0;
  if (in_registers && s.k > 0) return 0;
  const DType dt = call->inputs[0].dtype;
  const size_t split = tf32x3_workspace(tf32x3_shape(s));
  return split == 0 ? p_bytes(s, dt) : tf32x3_offset(s, dt) + split;
}

// The 'cuda' kernel's cost, and what 3xTF32 adds (add_tf32x3_cost).
Status gemm_epilogue_tf32x3_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    throw_if_error(gemm_epilogue_cost(call, out));
    add_tf32x3_cost(tf32x3_shape(op_checks::check_gemm_epilogue(call, true, DeviceType::kCuda)),
                    out);
  });
}

}  // namespace

void add_gemm_epilogue_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kGemmEpilogue, gemm_epilogue, gemm_epilogue_supports,
                   gemm_epilogue_cost, {DType::kF32, DType::kBF16, DType::kF16}, kCudaName,
                   kCudaPriority, gemm_epilogue_workspace);
  add_cuda_kernels(out, ops::kGemmEpilogue, gemm_epilogue_tf32x3, gemm_epilogue_tf32x3_supports,
                   gemm_epilogue_tf32x3_cost, {DType::kF32}, "cuda.tf32x3", kCudaPriority - 4,
                   gemm_epilogue_tf32x3_workspace);
}

}  // namespace loom::kernels::cuda::gemm
