// Argument checks of the head layout ops split_qkv / merge_qkv and swap_axes_12
// (loom/ops.h), shared by every kernel library so that all of them refuse a bad call with
// the same words. Each check throws loom::Error(kInvalidArgument) naming the op;
// `shapes_only` is true inside a kernel's `supports` (data may be null there), and `device`
// is the family of the calling kernel.
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// bt = B * T tokens, h query heads, g key/value heads (groups), d head dim.
struct QkvShape {
  int64_t bt, h, g, d;
};

/// X (B, T, G, (H/G + 2) * D) is input 0 of split_qkv and output 0 of merge_qkv; Q
/// (B, T, H, D), K and V (B, T, G, D) the other side. Every tensor is float, each may have
/// its own dtype.
inline QkvShape check_qkv(const OpCall* call, bool shapes_only, DeviceType device, bool merge) {
  OpArgs a = merge ? OpArgs(call, ops::kMergeQkv, {"dQ", "dK", "dV"}, {"dX"}, shapes_only, device)
                   : OpArgs(call, ops::kSplitQkv, {"X"}, {"Q", "K", "V"}, shapes_only, device);
  const TensorView& X = merge ? a.float_out(0) : a.float_in(0);
  const TensorView& Q = merge ? a.float_in(0) : a.float_out(0);
  const TensorView& K = merge ? a.float_in(1) : a.float_out(1);
  const TensorView& V = merge ? a.float_in(2) : a.float_out(2);
  std::string q_label = merge ? a.in_label(0) : a.out_label(0);
  std::string k_label = merge ? a.in_label(1) : a.out_label(1);
  if (Q.ndim != 4) a.fail(q_label + " has shape " + view_shape_str(Q) + ", expected (B, T, H, D)");
  if (K.ndim != 4) a.fail(k_label + " has shape " + view_shape_str(K) + ", expected (B, T, G, D)");
  int64_t B = Q.shape[0], T = Q.shape[1], H = Q.shape[2], D = Q.shape[3], G = K.shape[2];
  if (G <= 0 || H % G != 0)
    a.fail(k_label + " has shape " + view_shape_str(K) + ": its G = " + std::to_string(G) +
           " key/value heads must divide Q's H = " + std::to_string(H));
  if (merge) {
    a.shape_in(1, {B, T, G, D}, "(B, T, G, D)");
    a.shape_in(2, {B, T, G, D}, "(B, T, G, D)");
    a.shape_out(0, {B, T, G, (H / G + 2) * D}, "(B, T, G, (H/G + 2) * D)");
  } else {
    a.shape_out(1, {B, T, G, D}, "(B, T, G, D)");
    a.shape_out(2, {B, T, G, D}, "(B, T, G, D)");
    a.shape_in(0, {B, T, G, (H / G + 2) * D}, "(B, T, G, (H/G + 2) * D)");
  }
  (void)X;
  (void)V;
  return QkvShape{B * T, H, G, D};
}

inline QkvShape check_split_qkv(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_qkv(call, shapes_only, device, false);
}

inline QkvShape check_merge_qkv(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_qkv(call, shapes_only, device, true);
}

/// X is (a, i, j, d) with elements of `bytes` bytes; Y is (a, j, i, d).
struct SwapShape {
  int64_t a, i, j, d;
  size_t bytes;
};

/// swap_axes_12: X (A, I, J, D) -> Y (A, J, I, D), one dtype of 2 or 4 bytes for both,
/// contiguous, on the kernel's device, Y not aliasing X.
inline SwapShape check_swap_axes(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSwapAxes12, {"X"}, {"Y"}, shapes_only, device);
  const TensorView &X = a.in(0), &Y = a.out(0);
  if (!a.has_in(0) || !a.has_out(0)) a.fail("X and Y are required");
  for (int k = 0; k < 2; ++k) {
    const TensorView& v = k == 0 ? X : Y;
    if (v.device.type != device)
      a.fail((k == 0 ? a.in_label(0) : a.out_label(0)) + " is in " +
             device_type_name(v.device.type) + " memory: the " + device_type_name(device) +
             " kernels take " + device_type_name(device) + " tensors only");
  }
  size_t bytes = dtype_size(X.dtype);
  if (bytes != 2 && bytes != 4)
    a.fail(a.in_label(0) + " has dtype " + dtype_name(X.dtype) + ": expected one of 2 or 4 bytes");
  if (Y.dtype != X.dtype)
    a.fail(a.out_label(0) + " has dtype " + dtype_name(Y.dtype) + ", expected X's " +
           dtype_name(X.dtype) + " (use cast to convert)");
  if (!is_contiguous(X) || !is_contiguous(Y)) a.fail("X and Y must be contiguous");
  if (X.ndim != 4)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(X) + ", expected (A, I, J, D)");
  SwapShape s{X.shape[0], X.shape[1], X.shape[2], X.shape[3], bytes};
  a.shape_out(0, {s.a, s.j, s.i, s.d}, "(A, J, I, D)");
  if (!shapes_only && numel(X) > 0 && (X.data == nullptr || Y.data == nullptr))
    a.fail("X or Y has null data");
  if (!shapes_only && X.data == Y.data && numel(X) > 0)
    a.fail("Y must not alias X (a transpose cannot run in place)");
  return s;
}

}  // namespace loom::op_checks
