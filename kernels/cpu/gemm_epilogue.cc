// gemm_epilogue: a 2-D gemm with a dense layer's bias, gelu or gradient tail (loom/ops.h).
//
// On the CPU nothing is gained by fusing (the GEMM dominates and the tail reads Y from cache
// or memory either way), so both kernels run exactly the unfused sequence, which the
// contract allows and which keeps every CPU result bit for bit what it was before modules
// called this op:
//   kEpilogueBias       gemm -> Y; bias_add(bias) -> Y
//   kEpilogueGelu       gemm -> P; bias_add(bias) -> P; gelu_fwd(P) -> Y   (P: aux, or scratch)
//   kEpilogueDGelu      gemm -> Y; gelu_bwd(Y, P) -> Y; bias_grad(Y) -> dbias
//   kEpilogueBiasGradA  gemm (beta) -> Y; bias_grad(A) -> dbias   (A (K, M) when trans_a,
//                       else the column sums of A^T: see below)
// "cpu.ref" runs the reference kernel of each step, "cpu.fast" the fast one where the
// library has it (as a module resolving the unfused ops gets them).
#include <loom/cpp/op_checks/gemm.h>
#include <loom/cpp/tensor.h>

#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::GemmEpilogueShape;

GemmEpilogueShape check(const OpCall* call, bool shapes_only) {
  return op_checks::check_gemm_epilogue(call, shapes_only, DeviceType::kCpu);
}

void run(const OpCall* call, bool fast) {
  GemmEpilogueShape s = check(call, false);
  const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
  const ops::GemmEpilogueAttrs& at = s.attrs;
  const DType dt = A.dtype;
  const ops::GeluAttrs gelu{at.approximate};
  switch (at.epilogue) {
    case ops::kEpilogueBias: {
      ops::GemmAttrs g{at.trans_a, at.trans_b, 1.f, 0.f};
      run_library_op(ops::kGemm, dt, fast, {A, B}, {Y}, &g);
      run_library_op<int>(ops::kBiasAdd, Y.dtype, fast, {call->inputs[2]}, {Y}, nullptr);
      return;
    }
    case ops::kEpilogueGelu: {
      // P: the caller's aux, or scratch of Y's shape and dtype.
      std::vector<char> scratch;
      TensorView P = call->outputs[1];
      if (!s.aux_out) {
        scratch.resize(static_cast<size_t>(s.m * s.n) * dtype_size(dt));
        P = make_view(scratch.data(), dt, {s.m, s.n}, Y.device);
      }
      ops::GemmAttrs g{at.trans_a, at.trans_b, 1.f, 0.f};
      run_library_op(ops::kGemm, dt, fast, {A, B}, {P}, &g);
      if (s.bias) run_library_op<int>(ops::kBiasAdd, dt, fast, {call->inputs[2]}, {P}, nullptr);
      run_library_op(ops::kGeluFwd, dt, fast, {P}, {Y}, &gelu);
      return;
    }
    case ops::kEpilogueDGelu: {
      ops::GemmAttrs g{at.trans_a, at.trans_b, 1.f, 0.f};
      run_library_op(ops::kGemm, dt, fast, {A, B}, {Y}, &g);
      run_library_op(ops::kGeluBwd, dt, fast, {Y, call->inputs[3]}, {Y}, &gelu);
      if (s.dbias) run_library_op<int>(ops::kBiasGrad, dt, fast, {Y}, {call->outputs[2]}, nullptr);
      return;
    }
    case ops::kEpilogueBiasGradA: {
      ops::GemmAttrs g{at.trans_a, at.trans_b, 1.f, at.beta};
      run_library_op(ops::kGemm, dt, fast, {A, B}, {Y}, &g);
      if (!s.dbias) return;
      // dbias (M) += the row sums of op(A). With trans_a, A is stored (K, M) and these are
      // its column sums: bias_grad exactly as the unfused Linear runs it on dY (N, out).
      if (at.trans_a) {
        run_library_op<int>(ops::kBiasGrad, dt, fast, {A}, {call->outputs[2]}, nullptr);
        return;
      }
      // A stored (M, K): sum each row in f64, as bias_grad's reference sums.
      float* dbias = f32_mut(call->outputs[2]);
      std::vector<float> row(static_cast<size_t>(s.k));
      for (int64_t m = 0; m < s.m; ++m) {
        load_row(A.data, dt, m * s.k, s.k, row.data());
        double sum = 0;
        for (float v : row) sum += v;
        dbias[m] += static_cast<float>(sum);
      }
      return;
    }
  }
}

Status gemm_epilogue_ref(const OpCall* call) {
  return guard([&] { run(call, false); });
}
Status gemm_epilogue_fast(const OpCall* call) {
  return guard([&] { run(call, true); });
}

bool gemm_epilogue_supports(const OpCall* call) {
  return passes([&] { check(call, true); });
}
bool gemm_epilogue_fast_supports(const OpCall* call) {
  return cpu_has_avx2() && gemm_epilogue_supports(call);
}

Status gemm_epilogue_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    GemmEpilogueShape s = check(call, true);
    *out = io_cost(call, 2.0 * s.m * s.n * s.k);
    if (s.attrs.beta != 0.0f)  // Y is read too
      out->bytes_read += static_cast<double>(numel(call->outputs[0])) *
                         static_cast<double>(dtype_size(call->outputs[0].dtype));
  });
}

}  // namespace

void add_gemm_epilogue_kernels(std::vector<KernelDesc>& out) {
  add_kernels(out, ops::kGemmEpilogue, kRefName, kRefPriority, gemm_epilogue_ref,
              gemm_epilogue_supports, gemm_epilogue_cost);
  add_kernels(out, ops::kGemmEpilogue, kFastName, kFastPriority, gemm_epilogue_fast,
              gemm_epilogue_fast_supports, gemm_epilogue_cost);
}

}  // namespace loom::kernels::cpu
