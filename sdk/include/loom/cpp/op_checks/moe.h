// Argument checks of the mixture-of-experts ops (loom/ops/moe.h: moe_topk, moe_topk_bwd,
// moe_permute, moe_unpermute, moe_unpermute_bwd, grouped_gemm, grouped_gemm_wgrad), shared by
// every kernel library so that all of them refuse a bad call with the same words
// (header-only; see loom/cpp/op_args.h). Index values (expert ids, rows) are checked by the
// kernels that read them, not here (the data may live on a device).
#pragma once

#include <string>

#include "loom/cpp/kernel_descs.h"
#include "loom/cpp/op_args.h"
#include "loom/cpp/op_checks/f64.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// The problem a moe_topk / moe_topk_bwd call describes.
struct MoeTopkShape {
  int64_t n, e;  ///< tokens, experts
  ops::MoeTopkAttrs attrs;  ///< with num_groups >= 1 and scaling_factor != 0 filled in
};

inline ops::MoeTopkAttrs check_moe_topk_attrs(const OpArgs& a, int64_t e) {
  ops::MoeTopkAttrs at = a.attrs<ops::MoeTopkAttrs>();
  if (at.num_groups <= 0) at.num_groups = 1;
  if (at.scaling_factor == 0.0f) at.scaling_factor = 1.0f;
  if (at.k < 1 || at.k > e)
    a.fail("k = " + std::to_string(at.k) + " must be in [1, E] = [1, " + std::to_string(e) + "]");
  if (at.score != 0 && at.score != 1)
    a.fail("score = " + std::to_string(at.score) + " must be 0 (softmax) or 1 (sigmoid)");
  if (e % at.num_groups != 0)
    a.fail("num_groups = " + std::to_string(at.num_groups) + " must divide E = " +
           std::to_string(e));
  if (at.num_groups > 1) {
    if (at.group_topk < 1 || at.group_topk > at.num_groups)
      a.fail("group_topk = " + std::to_string(at.group_topk) + " must be in [1, num_groups = " +
             std::to_string(at.num_groups) + "]");
    if (at.k % at.group_topk != 0)
      a.fail("k = " + std::to_string(at.k) + " must be a multiple of group_topk = " +
             std::to_string(at.group_topk));
    if (at.k > at.group_topk * (e / at.num_groups))
      a.fail("k = " + std::to_string(at.k) + " exceeds the experts of the " +
             std::to_string(at.group_topk) + " groups kept");
  }
  return at;
}

/// The dtype of a router op's logits: f32 or f64 (loom/ops/moe.h); throws otherwise.
inline DType check_router_dtype(const OpArgs& a, int i) {
  const TensorView& L = float_or_f64_in(a, i);
  if (L.dtype != DType::kF32 && L.dtype != DType::kF64)
    a.fail(a.in_label(i) + " has dtype " + dtype_name(L.dtype) + ", expected f32 or f64");
  return L.dtype;
}

/// moe_topk: logits (N, E) f32 or f64, bias (E) f32 or empty -> probs (N, K) and lse (N) or
/// empty of the logits' dtype, experts (N, K) i32.
inline MoeTopkShape check_moe_topk(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMoeTopk, {"logits", "bias"}, {"probs", "experts", "lse"}, shapes_only,
           device);
  const DType dt = check_router_dtype(a, 0);
  const TensorView& L = a.in(0);
  if (L.ndim != 2) a.fail(a.in_label(0) + " has shape " + view_shape_str(L) + ", expected (N, E)");
  MoeTopkShape s{L.shape[0], L.shape[1], {}};
  s.attrs = check_moe_topk_attrs(a, s.e);
  if (a.opt_f32_in(1) != nullptr) {
    if (s.attrs.score != 1) a.fail("an expert bias needs the sigmoid score (score = 1)");
    a.shape_in(1, {s.e}, "(E)");
  }
  dtype_out(a, 0, dt);
  a.shape_out(0, {s.n, s.attrs.k}, "(N, K)");
  a.i32_out(1);
  a.shape_out(1, {s.n, s.attrs.k}, "(N, K)");
  if (opt_dtype_out(a, 2, dt) != nullptr) a.shape_out(2, {s.n}, "(N)");
  return s;
}

/// moe_topk_bwd: dprobs (N, K), logits (N, E), experts (N, K) i32, dlse (N) or empty ->
/// dlogits (N, E); all but the experts of the logits' dtype (f32 or f64).
inline MoeTopkShape check_moe_topk_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMoeTopkBwd, {"dprobs", "logits", "experts", "dlse"}, {"dlogits"},
           shapes_only, device);
  const DType dt = check_router_dtype(a, 1);
  const TensorView& L = a.in(1);
  if (L.ndim != 2) a.fail(a.in_label(1) + " has shape " + view_shape_str(L) + ", expected (N, E)");
  MoeTopkShape s{L.shape[0], L.shape[1], {}};
  s.attrs = check_moe_topk_attrs(a, s.e);
  dtype_in(a, 0, dt);
  a.shape_in(0, {s.n, s.attrs.k}, "(N, K)");
  a.i32_in(2);
  a.shape_in(2, {s.n, s.attrs.k}, "(N, K)");
  if (opt_dtype_in(a, 3, dt) != nullptr) a.shape_in(3, {s.n}, "(N)");
  dtype_out(a, 0, dt);
  a.shape_out(0, {s.n, s.e}, "(N, E)");
  return s;
}

/// Rows and width of a permutation call.
struct MoePermuteShape {
  int64_t n, m, c, k;  ///< tokens, rows, row width, choices per token (unpermute)
};

/// moe_permute: X (N, C), src (M) i32 -> Y (M, C) of X's dtype.
inline MoePermuteShape check_moe_permute(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMoePermute, {"X", "src"}, {"Y"}, shapes_only, device);
  const TensorView& X = a.float_in(0);
  if (X.ndim != 2) a.fail(a.in_label(0) + " has shape " + view_shape_str(X) + ", expected (N, C)");
  const TensorView& src = a.i32_in(1);
  if (src.ndim != 1) a.fail(a.in_label(1) + " has shape " + view_shape_str(src) + ", expected (M)");
  MoePermuteShape s{X.shape[0], src.shape[0], X.shape[1], 0};
  const TensorView& Y = a.float_out(0);
  if (Y.dtype != X.dtype) a.fail(a.out_label(0) + " must have X's dtype");
  a.shape_out(0, {s.m, s.c}, "(M, C)");
  return s;
}

/// moe_unpermute: Y (M, C), slot_rows (N, K) i32, weights (N, K) f32 or empty -> X (N, C).
inline MoePermuteShape check_moe_unpermute(const OpCall* call, bool shapes_only,
                                           DeviceType device) {
  OpArgs a(call, ops::kMoeUnpermute, {"Y", "slot_rows", "weights"}, {"X"}, shapes_only, device);
  const TensorView& Y = a.float_in(0);
  if (Y.ndim != 2) a.fail(a.in_label(0) + " has shape " + view_shape_str(Y) + ", expected (M, C)");
  const TensorView& rows = a.i32_in(1);
  if (rows.ndim != 2)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(rows) + ", expected (N, K)");
  MoePermuteShape s{rows.shape[0], Y.shape[0], Y.shape[1], rows.shape[1]};
  if (a.opt_f32_in(2) != nullptr) a.shape_in(2, {s.n, s.k}, "(N, K)");
  const TensorView& X = a.float_out(0);
  if (X.dtype != Y.dtype) a.fail(a.out_label(0) + " must have Y's dtype");
  a.shape_out(0, {s.n, s.c}, "(N, C)");
  return s;
}

/// moe_unpermute_bwd: dX (N, C), Y (M, C), slot_rows (N, K), weights (N, K) or empty,
/// row_slots (M) -> dY (M, C), dweights (N, K) or empty.
inline MoePermuteShape check_moe_unpermute_bwd(const OpCall* call, bool shapes_only,
                                               DeviceType device) {
  OpArgs a(call, ops::kMoeUnpermuteBwd, {"dX", "Y", "slot_rows", "weights", "row_slots"},
           {"dY", "dweights"}, shapes_only, device);
  const TensorView& dX = a.float_in(0);
  if (dX.ndim != 2)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(dX) + ", expected (N, C)");
  const TensorView& rows = a.i32_in(2);
  if (rows.ndim != 2 || rows.shape[0] != dX.shape[0])
    a.fail(a.in_label(2) + " has shape " + view_shape_str(rows) + ", expected (N, K) with N = " +
           std::to_string(dX.shape[0]));
  const TensorView& slots = a.i32_in(4);
  if (slots.ndim != 1)
    a.fail(a.in_label(4) + " has shape " + view_shape_str(slots) + ", expected (M)");
  MoePermuteShape s{dX.shape[0], slots.shape[0], dX.shape[1], rows.shape[1]};
  if (a.opt_f32_in(3) != nullptr) a.shape_in(3, {s.n, s.k}, "(N, K)");
  const TensorView& dY = a.float_out(0);
  if (dY.dtype != dX.dtype) a.fail(a.out_label(0) + " must have dX's dtype");
  a.shape_out(0, {s.m, s.c}, "(M, C)");
  if (a.opt_f32_out(1) != nullptr) {
    a.shape_out(1, {s.n, s.k}, "(N, K)");
    const TensorView& Y = a.float_in(1);
    if (Y.dtype != dX.dtype) a.fail(a.in_label(1) + " must have dX's dtype");
    a.shape_in(1, {s.m, s.c}, "(M, C)");
  }
  return s;
}

/// The problem a grouped GEMM call describes: Y (M, Nd) from X (M, Kd) and G weights.
struct GroupedGemmShape {
  int64_t m, n, k;  ///< rows, output width, inner width
  ops::GroupedGemmAttrs attrs;
};

inline void check_grouped_attrs(const OpArgs& a, const ops::GroupedGemmAttrs& at, int64_t m) {
  if (at.groups < 1) a.fail("groups = " + std::to_string(at.groups) + " must be >= 1");
  if (at.group_rows == nullptr || at.weights == nullptr)
    a.fail("group_rows and weights must be host arrays of `groups` entries");
  int64_t total = 0;
  for (int32_t g = 0; g < at.groups; ++g) {
    if (at.group_rows[g] < 0)
      a.fail("group_rows[" + std::to_string(g) + "] = " + std::to_string(at.group_rows[g]) +
             " is negative");
    total += at.group_rows[g];
    if (!a.shapes_only() && at.weights[g] == nullptr)
      a.fail("weights[" + std::to_string(g) + "] is null");
  }
  if (total != m)
    a.fail("group_rows sum to " + std::to_string(total) + ", but the rows are M = " +
           std::to_string(m));
}

/// grouped_gemm: X (M, Kd), W_0 (Nd, Kd) | (Kd, Nd) -> Y (M, Nd).
inline GroupedGemmShape check_grouped_gemm(const OpCall* call, bool shapes_only,
                                           DeviceType device) {
  OpArgs a(call, ops::kGroupedGemm, {"X", "W"}, {"Y"}, shapes_only, device);
  GroupedGemmShape s{};
  s.attrs = a.attrs<ops::GroupedGemmAttrs>();
  const TensorView& X = a.float_in(0);
  const TensorView& W = a.float_in(1);
  a.float_out(0);
  if (X.ndim != 2) a.fail(a.in_label(0) + " has shape " + view_shape_str(X) + ", expected (M, Kd)");
  if (W.ndim != 2)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(W) + ", expected " +
           (s.attrs.trans_b ? "(Nd, Kd)" : "(Kd, Nd)"));
  s.m = X.shape[0];
  s.k = X.shape[1];
  s.n = W.shape[s.attrs.trans_b ? 0 : 1];
  if (W.shape[s.attrs.trans_b ? 1 : 0] != s.k)
    a.fail(a.in_label(1) + " has shape " + view_shape_str(W) + ", its inner dimension must be Kd = " +
           std::to_string(s.k) + " (X is " + view_shape_str(X) + ")");
  a.shape_out(0, {s.m, s.n}, "(M, Nd)");
  check_grouped_attrs(a, s.attrs, s.m);
  return s;
}

/// grouped_gemm_wgrad: dY (M, Nd), X (M, Kd) -> dW_0 (Nd, Kd).
inline GroupedGemmShape check_grouped_gemm_wgrad(const OpCall* call, bool shapes_only,
                                                 DeviceType device) {
  OpArgs a(call, ops::kGroupedGemmWgrad, {"dY", "X"}, {"dW"}, shapes_only, device);
  GroupedGemmShape s{};
  s.attrs = a.attrs<ops::GroupedGemmAttrs>();
  const TensorView& dY = a.float_in(0);
  const TensorView& X = a.float_in(1);
  a.float_out(0);
  if (dY.ndim != 2)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(dY) + ", expected (M, Nd)");
  if (X.ndim != 2 || X.shape[0] != dY.shape[0])
    a.fail(a.in_label(1) + " has shape " + view_shape_str(X) + ", expected (M, Kd) with M = " +
           std::to_string(dY.shape[0]));
  s.m = dY.shape[0];
  s.n = dY.shape[1];
  s.k = X.shape[1];
  a.shape_out(0, {s.n, s.k}, "(Nd, Kd)");
  check_grouped_attrs(a, s.attrs, s.m);
  if (!shapes_only && call->outputs[0].data != s.attrs.weights[0])
    a.fail(a.out_label(0) + " must be the first group's gradient (weights[0])");
  return s;
}

/// What a grouped_gemm call costs, the same for every kernel library: 2 M Nd Kd FLOPs, every
/// tensor of the call once and every other group's weight.
inline OpCost grouped_gemm_cost(const OpCall* call, const GroupedGemmShape& s) {
  OpCost out = io_cost(call, 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n * s.k));
  out.bytes_read += static_cast<double>(s.attrs.groups - 1) * static_cast<double>(s.n * s.k) *
                    static_cast<double>(dtype_size(call->inputs[1].dtype));
  return out;
}

/// What a grouped_gemm_wgrad call costs: every dW_g written, and read too when beta != 0.
inline OpCost grouped_gemm_wgrad_cost(const OpCall* call, const GroupedGemmShape& s) {
  OpCost out = io_cost(call, 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n * s.k));
  const double dw =
      static_cast<double>(s.n * s.k) * static_cast<double>(dtype_size(call->outputs[0].dtype));
  out.bytes_written += static_cast<double>(s.attrs.groups - 1) * dw;
  if (s.attrs.beta != 0.0f) out.bytes_read += static_cast<double>(s.attrs.groups) * dw;
  return out;
}

}  // namespace loom::op_checks
