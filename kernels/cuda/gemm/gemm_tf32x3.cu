// gemm (loom/ops.h) on f32 in 3xTF32: kernel "cuda.tf32x3" (tf32x3.cuh explains the split;
// tf32x3_gemm.cuh the driver's contract). A call runs in one of two forms (Tf32x3Form):
//
// In registers (the default): tf32x3_mma.cuh's GEMM kernel splits the operands as it reads
// them, one launch (two for a split contraction, whose partial sums go to the stream scratch);
// no workspace.
//
// Split: per chunk of K, one launch of tf32x3_split_kernel writes A2 and B2 into the
// workspace, then one or two cublasLtMatmul calls (three segments or two: tf32x3.cuh) with
// CUBLAS_COMPUTE_32F_FAST_TF32 add the chunk's terms to Y. In
// cuBLAS's column-major terms (gemm.cu's file comment) each is the "TN" product
//   Y^T (N, M') = B2 (N, kx)^T-stored-as (kx, N) column-major, op T  x  A2 (kx, M'), op N
// with M' = batch * M when B is shared (the batch folded into M: A2 is contiguous) and
// a strided batch otherwise; kx = 3 kp (one matmul), or 2 kp (GEMM 1) and kp (GEMM 2,
// leading dimensions 2 kp, B2 from its column kp on). A bias, when given, is the last
// matmul's epilogue in the last chunk (CUBLASLT_EPILOGUE_BIAS over cuBLAS's rows: loom's
// columns).
//
// The split form's workspace: the call's (KernelDesc::workspace asks for tf32x3_workspace),
// or the upper half of the stream scratch when a caller passes none; cuBLASLt's own workspace
// is the lower half.
#include <cublasLt.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/gemm.h>
#include <loom/cpp/tensor.h>

#include <algorithm>
#include <array>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/gemm/cublaslt.cuh"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/registry.cuh"
#include "kernels/cuda/gemm/tf32x3.cuh"
#include "kernels/cuda/gemm/tf32x3_gemm.cuh"
#include "kernels/cuda/gemm/tf32x3_mma.cuh"

namespace loom::kernels::cuda::gemm {
namespace {

constexpr size_t kLtWorkspace = kScratchBytes / 2;  // cuBLASLt's; the split may use the rest

// One TF32 matmul of a chunk, in cuBLAS's terms.
struct Tf32Problem {
  int64_t device, m, n, k, ld, batch, stride_a, stride_b, stride_c;
  int64_t bias;  // 1: CUBLASLT_EPILOGUE_BIAS
  int64_t align_a, align_b, align_c, align_bias;
  std::array<int64_t, 14> key() const {
    return {device,   m,        n,    k,       ld,      batch,   stride_a,
            stride_b, stride_c, bias, align_a, align_b, align_c, align_bias};
  }
};

cublasLtMatmulDesc_t make_desc(const char* op, cublasLtMatmulDescOpaque_t* storage,
                               const float* bias) {
  cublasLtMatmulDesc_t desc = storage;
  lt_check(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F), op,
           "cublasLtMatmulDescInit");
  set_desc(op, desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(op, desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (bias != nullptr) {
    set_desc(op, desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_desc(op, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    set_desc(op, desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(CUDA_R_32F));
  }
  return desc;
}

void make_plan(const char* op, cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const Tf32Problem& p,
               Plan* plan) {
  make_layouts(op, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_32F, CUDA_R_32F, p.m, p.n, p.k, plan);
  set_layout(op, plan->a, CUBLASLT_MATRIX_LAYOUT_LD, p.ld);
  set_layout(op, plan->b, CUBLASLT_MATRIX_LAYOUT_LD, p.ld);
  if (p.batch > 1) {
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {plan->a, p.stride_a}, {plan->b, p.stride_b}, {plan->c, p.stride_c}};
    for (const auto& [layout, stride] : layouts) {
      set_layout(op, layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(p.batch));
      set_layout(op, layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
    }
  }
  Preference pref(op, static_cast<uint32_t>(p.align_a), static_cast<uint32_t>(p.align_b),
                  static_cast<uint32_t>(p.align_c), CUDA_R_32F, kLtWorkspace);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(h, desc, plan->a, plan->b, plan->c,
                                                         plan->c, pref.pref, 1, &result, &count);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && count == 0))
    throw Error(Code::kUnimplemented,
                std::string(op) +
                    ": cuBLASLt has no TF32 algorithm for the 3xTF32 product (cuBLAS m = " +
                    std::to_string(p.m) + ", n = " + std::to_string(p.n) +
                    ", k = " + std::to_string(p.k) + "); pin the 'cuda' kernel instead");
  lt_check(status, op, "cublasLtMatmulAlgoGetHeuristic");
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
}

// Y = alpha * (A2 x B2 over kx columns) + beta * Y in cuBLAS's terms (file comment).
void matmul(const char* op, cublasLtHandle_t h, const Tf32Problem& p, const float* b2,
            const float* a2, float* y, float alpha, float beta, const float* bias,
            const Scratch& lt_ws, cudaStream_t stream) {
  cublasLtMatmulDescOpaque_t storage;
  cublasLtMatmulDesc_t desc = make_desc(op, &storage, bias);
  static auto* cache = new PlanCache<std::array<int64_t, 14>>();  // leaked: see resources.cuh
  PlanOwner owner;
  const Plan plan = cache->get(p.key(), &owner, [&](Plan* out) { make_plan(op, h, desc, p, out); });
  lt_check(cublasLtMatmul(h, desc, &alpha, b2, plan.a, a2, plan.b, &beta, y, plan.c, y, plan.c,
                          &plan.algo, lt_ws.data, plan.workspace, stream),
           op, "cublasLtMatmul");
}

// The call's form: the one its shape names (s.form, and s.segments for the split form), else
// the one LOOM_TF32X3 forces (read once): "auto" (the default: in registers), "registers",
// "split" (the split form, its segments by tf32x3_segments' byte model), "one" (split, three
// segments, one matmul) or "two" (split, two segments, two matmuls), to measure one against
// the other (tools/gpu_bundle_run.sh). The result names both: form kInRegisters, or kSplit with
// segments 2 or 3.
Tf32x3Shape with_form(Tf32x3Shape s) {
  struct Forced {
    Tf32x3Form form;
    int segments;  // 0: the byte model's
  };
  static const Forced forced = [] {
    switch (env_choice(ops::kGemm, "LOOM_TF32X3", {"auto", "registers", "split", "one", "two"})) {
      case 2:
        return Forced{Tf32x3Form::kSplit, 0};
      case 3:
        return Forced{Tf32x3Form::kSplit, 3};
      case 4:
        return Forced{Tf32x3Form::kSplit, 2};
      default:
        return Forced{Tf32x3Form::kInRegisters, 0};
    }
  }();
  if (s.form == Tf32x3Form::kAuto) {
    s.form = forced.form;
    s.segments = forced.segments;
  }
  if (s.form == Tf32x3Form::kSplit)
    s.segments = tf32x3_segments(s, s.segments == 2 || s.segments == 3 ? s.segments : 0);
  return s;
}

// Where the split operands go, read once from LOOM_TF32X3_WORKSPACE: "whole" (the default) asks
// the caller for them whole, up to kTf32x3MaxWorkspace; "scratch" asks for nothing and splits
// into the stream scratch's upper half (16 MiB), in more chunks of K. The first can hold tens
// of MiB at a step's memory peak (the default spec's output layer: 68-72 MiB while its
// gradients are computed); the second holds no memory beyond the scratch but launches more
// kernels. To measure one against the other (tools/gpu_bundle_run.sh).
bool split_in_scratch() {
  static const bool scratch =
      env_choice(ops::kGemm, "LOOM_TF32X3_WORKSPACE", {"whole", "scratch"}) == 1;
  return scratch;
}

// The in-register form (tf32x3_mma.cuh): its launches on `stream`, a split contraction's
// partial sums in the stream scratch (whole: cuBLASLt, which uses its lower half, does not
// run in this form).
void run_in_registers(const char* op, const Tf32x3Shape& s, const float* A, const float* B,
                      float* Y, float alpha, float beta, const float* bias,
                      const Tf32x3Activation& act, const Scratch& scratch, cudaStream_t stream,
                      int device) {
  const int sms = multiprocessor_count(device);
  const Tf32x3MmaPlan plan = plan_tf32x3_mma(s.batch, s.m, s.n, s.k, sms, scratch.bytes);
  const int64_t bn = plan.large ? kTf32x3LargeTileN : kTf32x3SmallTileN;
  if (ceil_div(s.n, bn) > 65535)  // gridDim.y
    throw Error(Code::kInvalidArgument, std::string(op) + ": cuda.tf32x3 takes at most " +
                                            std::to_string(65535 * bn) +
                                            " columns of Y and was given " + std::to_string(s.n) +
                                            "; pin the 'cuda' kernel for this call");
  auto launch = [&](const Tf32x3MmaLaunch& l) {
    l.kernel<<<dim3(l.grid_x, l.grid_y, l.grid_z), kTf32x3MmaThreads, 0, stream>>>(l.params);
    launch_check(op);
  };
  auto sum = [&](const Tf32x3PartialSumParams& q) {
    const int64_t blocks =
        std::min<int64_t>(ceil_div(q.count, kTf32x3SumThreads), std::max(sms, 1) * int64_t{8});
    tf32x3_partial_sum_kernel<<<static_cast<unsigned>(blocks), kTf32x3SumThreads, 0, stream>>>(q);
    launch_check(op);
  };
  tf32x3_mma_launches(s, plan, A, B, Y, alpha, beta, bias, act, tf32x3_mma_vec(s, A, B),
                      static_cast<float*>(scratch.data), launch, sum);
}

}  // namespace

size_t tf32x3_workspace(const Tf32x3Shape& shape) {
  // A workspace function cannot fail: a bad LOOM_TF32X3 or LOOM_TF32X3_WORKSPACE asks for
  // nothing here, and run_tf32x3 reports it (inside the kernel's guard).
  Tf32x3Shape s;
  bool scratch = false;
  if (!check_passes([&] {
        s = with_form(shape);
        scratch = split_in_scratch();
      }))
    return 0;
  if (s.form == Tf32x3Form::kInRegisters || s.k <= 0 || s.batch * s.m == 0 || s.n == 0 || scratch)
    return 0;
  const size_t least = tf32x3_chunk_bytes(s, 4);
  return plan_tf32x3(s, std::max(kTf32x3MaxWorkspace, least)).bytes;
}

void add_tf32x3_cost(const Tf32x3Shape& shape, OpCost* out) {
  const Tf32x3Shape s = with_form(shape);
  out->flops *= 3;
  // In registers: no bytes besides the plain GEMM's (a split contraction's partial sums, a few
  // MB at most, are left out: their ranges depend on the GPU).
  if (s.form == Tf32x3Form::kInRegisters) return;
  // Elements of A and B: each written once per segment by the split and read three times by
  // the matmuls (2 kp + kp columns, or 3 kp); K's padding to 4 left out.
  const double split =
      4.0 * static_cast<double>(s.batch * s.m * s.k + (s.shared_b ? 1 : s.batch) * s.n * s.k);
  out->bytes_written += s.segments * split;
  out->bytes_read += 3 * split;
  if (s.segments == 2) {  // the second matmul adds into Y (beta 1)
    const double y = 4.0 * static_cast<double>(s.batch * s.m * s.n);
    out->bytes_read += y;
    out->bytes_written += y;
  }
}

bool tf32x3_in_registers(const Tf32x3Shape& shape) {
  return with_form(shape).form == Tf32x3Form::kInRegisters;
}

void run_tf32x3(const char* op, const Tf32x3Shape& shape, const float* A, const float* B, float* Y,
                float alpha, float beta, const float* bias, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, int device, const Tf32x3Activation& act) {
  const Tf32x3Shape s = with_form(shape);
  if (act.kind != Tf32x3Activation::kNone && (s.form != Tf32x3Form::kInRegisters || s.k == 0))
    throw Error(Code::kInternal, std::string(op) +
                                     ": cuda.tf32x3 applies an activation only in registers and "
                                     "with K > 0 (the caller runs the unfused sequence otherwise)");
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  if (s.k == 0) {  // an empty sum: Y = beta * Y (a bias is the caller's to add)
    if (bias != nullptr)
      throw Error(Code::kInvalidArgument,
                  std::string(op) + ": cuda.tf32x3 takes no bias when K == 0 (the caller adds it)");
    scale_y(op, make_view(Y, DType::kF32, {s.batch * s.m * s.n}, Device{DeviceType::kCuda, device}),
            beta, stream);
    return;
  }
  const Scratch scratch = stream_scratch(device, stream);
  if (s.form == Tf32x3Form::kInRegisters) {
    run_in_registers(op, s, A, B, Y, alpha, beta, bias, act, scratch, stream, device);
    return;
  }
  const Scratch lt_ws{scratch.data, kLtWorkspace};
  if (workspace == nullptr || split_in_scratch()) {
    workspace = static_cast<char*>(scratch.data) + kLtWorkspace;
    workspace_bytes = scratch.bytes - kLtWorkspace;
  }
  const Tf32x3Plan plan = plan_tf32x3(s, workspace_bytes);
  if (plan.chunks.empty())
    throw Error(Code::kResourceExhausted,
                std::string(op) + ": cuda.tf32x3 needs " +
                    std::to_string(tf32x3_chunk_bytes(s, 4)) +
                    " bytes of workspace for 4 columns of K and was given " +
                    std::to_string(workspace_bytes) +
                    "; call it through loom::Kernel, which allocates what it asks for");
  float* a2 = static_cast<float*>(workspace);
  float* b2 = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.b2_offset);
  cublasLtHandle_t h = lt_handle(op, device);
  const bool fold = s.shared_b;  // A2 is (batch * M, segments * kp): one matrix
  const int64_t batch = fold ? 1 : s.batch;
  auto split = [&](const SplitParams& sp) {
    const int64_t blocks = sp.tiles0 + split_tiles(sp.sides[1], sp.kp);
    tf32x3_split_kernel<<<static_cast<unsigned>(blocks), kSplitThreads, 0, stream>>>(sp);
    launch_check(op);
  };
  auto tf32_matmul = [&](const Tf32Matmul& mm) {
    Tf32Problem p{};
    p.device = device;
    p.m = s.n;
    p.n = fold ? s.batch * s.m : s.m;
    p.k = mm.k;
    p.ld = mm.ld;
    p.batch = batch;
    p.stride_a = batch > 1 ? s.n * mm.ld : 0;
    p.stride_b = batch > 1 ? s.m * mm.ld : 0;
    p.stride_c = batch > 1 ? s.m * s.n : 0;
    p.align_a = alignment_of(mm.b2, p.stride_a * 4);
    p.align_b = alignment_of(mm.a2, p.stride_b * 4);
    p.align_c = alignment_of(Y, p.stride_c * 4);
    p.bias = mm.bias;
    p.align_bias = mm.bias ? alignment_of(bias, 0) : 0;
    matmul(op, h, p, mm.b2, mm.a2, Y, alpha, mm.beta, mm.bias ? bias : nullptr, lt_ws, stream);
  };
  tf32x3_steps(s, plan, A, B, a2, b2, beta, bias != nullptr, split, tf32_matmul);
  mark_written(Y, static_cast<size_t>(s.batch * s.m * s.n) * sizeof(float), stream);
}

namespace {

Tf32x3Shape shape_of(const op_checks::GemmShape& g) {
  Tf32x3Shape s;
  s.batch = g.batch;
  s.m = g.m;
  s.n = g.n;
  s.k = g.k;
  s.trans_a = g.attrs.trans_a != 0;
  s.trans_b = g.attrs.trans_b != 0;
  s.shared_b = g.shared_b;
  return s;
}

void check_f32(const OpCall* call) {
  for (const TensorView* t : std::initializer_list<const TensorView*>{
           &call->inputs[0], &call->inputs[1], &call->outputs[0]})
    if (t->dtype != DType::kF32)
      throw Error(Code::kInvalidArgument,
                  std::string("gemm: cuda.tf32x3 takes f32 A, B and Y, and was given ") +
                      dtype_name(t->dtype) + " (bf16 and f16 run on tensor cores in 'cuda')");
}

Status gemm_tf32x3_fn(const OpCall* call) {
  return guard([&] {
    const op_checks::GemmShape g = op_checks::check_gemm(call, false, DeviceType::kCuda);
    check_f32(call);
    const TensorView& Y = call->outputs[0];
    const int device = current_device(ops::kGemm, Y);
    run_tf32x3(ops::kGemm, shape_of(g), static_cast<const float*>(call->inputs[0].data),
               static_cast<const float*>(call->inputs[1].data), static_cast<float*>(Y.data),
               g.attrs.alpha, g.attrs.beta, nullptr, call->workspace, call->workspace_bytes,
               stream_of(call), device);
  });
}

bool gemm_tf32x3_supports(const OpCall* call) {
  return check_passes([&] {
    const op_checks::GemmShape g = op_checks::check_gemm(call, true, DeviceType::kCuda);
    check_f32(call);
    if (!g.shared_b && g.batch > INT32_MAX) throw 0;
  });
}

uint64_t gemm_tf32x3_workspace_fn(const OpCall* call) {
  op_checks::GemmShape g{};
  if (!check_passes([&] { g = op_checks::check_gemm(call, true, DeviceType::kCuda); })) return 0;
  return tf32x3_workspace(shape_of(g));
}

// The plain GEMM's cost, and what 3xTF32 adds (add_tf32x3_cost).
Status gemm_tf32x3_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    const op_checks::GemmShape g = op_checks::check_gemm(call, true, DeviceType::kCuda);
    *out = io_cost(call, 2.0 * g.batch * g.m * g.n * g.k);
    if (g.attrs.beta != 0.0f) out->bytes_read += 4.0 * static_cast<double>(numel(call->outputs[0]));
    add_tf32x3_cost(shape_of(g), out);
  });
}

}  // namespace

void add_gemm_tf32x3_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kGemm, gemm_tf32x3_fn, gemm_tf32x3_supports, gemm_tf32x3_cost,
                   {DType::kF32}, "cuda.tf32x3", kCudaPriority - 4, gemm_tf32x3_workspace_fn);
}

}  // namespace loom::kernels::cuda::gemm

namespace loom::kernels::cuda {

Status gemm_tf32x3(const OpCall* call) { return gemm::gemm_tf32x3_fn(call); }

uint64_t gemm_tf32x3_workspace(const OpCall* call) { return gemm::gemm_tf32x3_workspace_fn(call); }

}  // namespace loom::kernels::cuda
