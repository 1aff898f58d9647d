// grouped_gemm / grouped_gemm_wgrad: one GEMM per expert over its run of rows
// (loom/ops/moe.h), as one gemm call per non-empty group through this library's own gemm
// kernels: the reference loops over the reference gemm (f64 accumulation), the fast one
// over the fast gemm (OpenBLAS). A group with no rows touches nothing in grouped_gemm and
// scales its weight gradient by beta in grouped_gemm_wgrad (a gemm with K = 0).
#include <loom/cpp/op_checks/moe.h>

#include <loom/cpp/tensor.h>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::GroupedGemmShape;

GroupedGemmShape check_grouped(const OpCall* call, bool shapes_only) {
  return op_checks::check_grouped_gemm(call, shapes_only, DeviceType::kCpu);
}
GroupedGemmShape check_wgrad(const OpCall* call, bool shapes_only) {
  return op_checks::check_grouped_gemm_wgrad(call, shapes_only, DeviceType::kCpu);
}

// Rows [r, r + m) of a (rows, width) tensor.
TensorView row_slice(const TensorView& v, int64_t r, int64_t m) {
  int64_t width = v.shape[1];
  char* base = static_cast<char*>(v.data) + r * width * static_cast<int64_t>(dtype_size(v.dtype));
  return make_view(base, v.dtype, {m, width}, v.device);
}

void run_gemm(const char* kernel, const TensorView& a, const TensorView& b, TensorView y,
              const ops::GemmAttrs& attrs) {
  const KernelDesc* k = find_kernel(ops::kGemm, a.dtype, kernel);
  if (k == nullptr) throw Error(Code::kInternal, std::string("grouped gemm: no gemm ") + kernel);
  TensorView in[2] = {a, b};
  OpCall call{sizeof(OpCall), in, 2, &y, 1, &attrs, sizeof(attrs), nullptr, nullptr, 0};
  throw_if_error(k->fn(&call), "grouped gemm");
}

// Y[rows g] = alpha X[rows g] @ op(W_g) + beta Y[rows g], one gemm per non-empty group.
Status grouped_gemm_with(const OpCall* call, const char* kernel) {
  return guard([&] {
    GroupedGemmShape s = check_grouped(call, false);
    const TensorView &X = call->inputs[0], &W = call->inputs[1], &Y = call->outputs[0];
    ops::GemmAttrs attrs{0, s.attrs.trans_b, s.attrs.alpha, s.attrs.beta};
    int64_t r = 0;
    for (int32_t g = 0; g < s.attrs.groups; ++g) {
      int64_t m = s.attrs.group_rows[g];
      if (m > 0) {
        TensorView w = W;
        w.data = s.attrs.weights[g];
        run_gemm(kernel, row_slice(X, r, m), w, row_slice(Y, r, m), attrs);
      }
      r += m;
    }
  });
}

// dW_g = alpha dY[rows g]^T @ X[rows g] + beta dW_g for every group.
Status grouped_gemm_wgrad_with(const OpCall* call, const char* kernel) {
  return guard([&] {
    GroupedGemmShape s = check_wgrad(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1], &dW = call->outputs[0];
    ops::GemmAttrs attrs{1, 0, s.attrs.alpha, s.attrs.beta};
    int64_t r = 0;
    for (int32_t g = 0; g < s.attrs.groups; ++g) {
      int64_t m = s.attrs.group_rows[g];
      TensorView out = dW;
      out.data = s.attrs.weights[g];
      run_gemm(kernel, row_slice(dY, r, m), row_slice(X, r, m), out, attrs);
      r += m;
    }
  });
}

Status grouped_gemm_ref(const OpCall* call) { return grouped_gemm_with(call, kRefName); }
Status grouped_gemm_fast(const OpCall* call) { return grouped_gemm_with(call, kFastName); }
Status grouped_gemm_wgrad_ref(const OpCall* call) {
  return grouped_gemm_wgrad_with(call, kRefName);
}
Status grouped_gemm_wgrad_fast(const OpCall* call) {
  return grouped_gemm_wgrad_with(call, kFastName);
}

bool grouped_gemm_supports(const OpCall* c) {
  return passes([&] { check_grouped(c, true); });
}
bool grouped_gemm_fast_supports(const OpCall* c) {
  return cpu_has_avx2() && grouped_gemm_supports(c);
}
bool grouped_gemm_wgrad_supports(const OpCall* c) {
  return passes([&] { check_wgrad(c, true); });
}
bool grouped_gemm_wgrad_fast_supports(const OpCall* c) {
  return cpu_has_avx2() && grouped_gemm_wgrad_supports(c);
}
Status grouped_gemm_cost(const OpCall* c, OpCost* out) {
  return guard([&] { *out = op_checks::grouped_gemm_cost(c, check_grouped(c, true)); });
}
Status grouped_gemm_wgrad_cost(const OpCall* c, OpCost* out) {
  return guard([&] { *out = op_checks::grouped_gemm_wgrad_cost(c, check_wgrad(c, true)); });
}

}  // namespace

void add_grouped_gemm_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kGroupedGemm, grouped_gemm);
  LOOM_CPU_REGISTER(out, ops::kGroupedGemmWgrad, grouped_gemm_wgrad);
}

}  // namespace loom::kernels::cpu
