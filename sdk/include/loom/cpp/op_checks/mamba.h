// Argument checks of the Mamba-2 ops (loom/ops/mamba.h: causal_conv1d, causal_conv1d_bwd,
// ssd_scan, ssd_scan_bwd, rmsnorm_gated, rmsnorm_gated_bwd), shared by every kernel library so
// that all of them refuse a bad call with the same words (header-only; see loom/cpp/op_args.h).
// Every float tensor of a call but the f32 ones (states of ssd_scan, rstd, parameter
// gradients) has the dtype of the call's main input.
#pragma once

#include <stdint.h>

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

namespace mamba_detail {

/// Input i: a float tensor of `dtype`, the dtype of the input named `ref_name`.
inline const TensorView& same_dtype_in(const OpArgs& a, int i, DType dtype, const char* ref_name) {
  const TensorView& v = a.float_in(i);
  if (v.dtype != dtype)
    a.fail(a.in_label(i) + " has dtype " + dtype_name(v.dtype) + ", expected " + ref_name +
           "'s dtype " + dtype_name(dtype));
  return v;
}
inline const TensorView* opt_same_dtype_in(const OpArgs& a, int i, DType dtype,
                                           const char* ref_name) {
  return a.has_in(i) ? &same_dtype_in(a, i, dtype, ref_name) : nullptr;
}
inline const TensorView& same_dtype_out(const OpArgs& a, int i, DType dtype, const char* ref_name) {
  const TensorView& v = a.float_out(i);
  if (v.dtype != dtype)
    a.fail(a.out_label(i) + " has dtype " + dtype_name(v.dtype) + ", expected " + ref_name +
           "'s dtype " + dtype_name(dtype));
  return v;
}
inline const TensorView* opt_same_dtype_out(const OpArgs& a, int i, DType dtype,
                                            const char* ref_name) {
  return a.has_out(i) ? &same_dtype_out(a, i, dtype, ref_name) : nullptr;
}

/// True when the bytes of two views overlap (views with no data never do).
inline bool overlaps(const TensorView& u, const TensorView& v) {
  if (u.data == nullptr || v.data == nullptr) return false;
  const char* a0 = static_cast<const char*>(u.data);
  const char* b0 = static_cast<const char*>(v.data);
  const char* a1 = a0 + numel(u) * static_cast<int64_t>(dtype_size(u.dtype));
  const char* b1 = b0 + numel(v) * static_cast<int64_t>(dtype_size(v.dtype));
  return a0 < b1 && b0 < a1 && a0 != a1 && b0 != b1;
}

/// An optional gradient output that must be present exactly when input `in` is.
inline void grad_iff(const OpArgs& a, int out, int in) {
  if (a.has_out(out) != a.has_in(in))
    a.fail(a.out_label(out) + " must be " + (a.has_in(in) ? "given" : "empty") + " when " +
           a.in_label(in) + " is " + (a.has_in(in) ? "given" : "empty"));
}

}  // namespace mamba_detail

// ---------------------------------------------------------------------------------------
// causal_conv1d
// ---------------------------------------------------------------------------------------

/// The problem a causal_conv1d / causal_conv1d_bwd call describes.
struct CausalConv1dShape {
  int64_t b, t, c, w;  ///< batch, tokens, channels (Cc), width (W)
  ops::CausalConv1dAttrs attrs;
};

/// The checks both directions share, x at input `xi`, weight at xi + 1, bias at xi + 2 and
/// initial_state at xi + 3.
inline CausalConv1dShape check_causal_conv1d_common(const OpArgs& a, int xi) {
  CausalConv1dShape s{};
  s.attrs = a.attrs<ops::CausalConv1dAttrs>();
  if (s.attrs.activation != 0 && s.attrs.activation != 1)
    a.fail("activation = " + std::to_string(s.attrs.activation) + " must be 0 (none) or 1 (SiLU)");
  const TensorView& x = a.float_in(xi);
  if (x.ndim != 3)
    a.fail(a.in_label(xi) + " has shape " + view_shape_str(x) + ", expected (B, T, Cc)");
  s.b = x.shape[0];
  s.t = x.shape[1];
  s.c = x.shape[2];
  const TensorView& w = mamba_detail::same_dtype_in(a, xi + 1, x.dtype, "x");
  if (w.ndim != 2 || w.shape[0] != s.c)
    a.fail(a.in_label(xi + 1) + " has shape " + view_shape_str(w) +
           ", expected (Cc, W) with Cc = " + std::to_string(s.c));
  s.w = w.shape[1];
  if (s.w < 1 || s.w > 8)
    a.fail(a.in_label(xi + 1) + " has shape " + view_shape_str(w) +
           ": the width W = " + std::to_string(s.w) + " must be in [1, 8]");
  if (mamba_detail::opt_same_dtype_in(a, xi + 2, x.dtype, "x") != nullptr)
    a.shape_in(xi + 2, {s.c}, "(Cc)");
  if (mamba_detail::opt_same_dtype_in(a, xi + 3, x.dtype, "x") != nullptr)
    a.shape_in(xi + 3, {s.b, s.w - 1, s.c}, "(B, W - 1, Cc)");
  return s;
}

/// causal_conv1d: x (B, T, Cc), weight (Cc, W), bias (Cc) or empty, initial_state
/// (B, W - 1, Cc) or empty -> y (B, T, Cc), final_state (B, W - 1, Cc) or empty (not aliasing
/// an input); all of x's dtype.
inline CausalConv1dShape check_causal_conv1d(const OpCall* call, bool shapes_only,
                                             DeviceType device) {
  OpArgs a(call, ops::kCausalConv1d, {"x", "weight", "bias", "initial_state"}, {"y", "final_state"},
           shapes_only, device);
  CausalConv1dShape s = check_causal_conv1d_common(a, 0);
  const DType dt = a.in(0).dtype;
  mamba_detail::same_dtype_out(a, 0, dt, "x");
  a.shape_out(0, {s.b, s.t, s.c}, "(B, T, Cc)");
  if (mamba_detail::opt_same_dtype_out(a, 1, dt, "x") != nullptr) {
    a.shape_out(1, {s.b, s.w - 1, s.c}, "(B, W - 1, Cc)");
    if (!shapes_only)
      for (int i = 0; i < 4; ++i)
        if (a.has_in(i) && mamba_detail::overlaps(a.out(1), a.in(i)))
          a.fail(a.out_label(1) + " overlaps " + a.in_label(i) +
                 ": the final state must not alias an input");
  }
  return s;
}

/// causal_conv1d_bwd: dy (B, T, Cc), x, weight, bias or empty, initial_state or empty ->
/// dx (B, T, Cc) of x's dtype, dweight f32 (Cc, W) +=, dbias f32 (Cc) += (exactly when bias).
inline CausalConv1dShape check_causal_conv1d_bwd(const OpCall* call, bool shapes_only,
                                                 DeviceType device) {
  OpArgs a(call, ops::kCausalConv1dBwd, {"dy", "x", "weight", "bias", "initial_state"},
           {"dx", "dweight", "dbias"}, shapes_only, device);
  CausalConv1dShape s = check_causal_conv1d_common(a, 1);
  const DType dt = a.in(1).dtype;
  mamba_detail::same_dtype_in(a, 0, dt, "x");
  a.shape_in(0, {s.b, s.t, s.c}, "(B, T, Cc)");
  mamba_detail::same_dtype_out(a, 0, dt, "x");
  a.shape_out(0, {s.b, s.t, s.c}, "(B, T, Cc)");
  a.f32_out(1);
  a.shape_out(1, {s.c, s.w}, "(Cc, W)");
  mamba_detail::grad_iff(a, 2, 3);
  if (a.opt_f32_out(2) != nullptr) a.shape_out(2, {s.c}, "(Cc)");
  return s;
}

// ---------------------------------------------------------------------------------------
// ssd_scan
// ---------------------------------------------------------------------------------------

/// The problem a ssd_scan / ssd_scan_bwd call describes.
struct SsdScanShape {
  int64_t b, t, h, p, g, n;  ///< batch, tokens, heads, head dim, groups, state dim
  ops::SsdScanAttrs attrs;   ///< with chunk_size filled in (0 -> 64)
};

/// The checks both directions share: xBC at input `xi`, then dt_in, A_log, D, dt_bias,
/// initial_state.
inline SsdScanShape check_ssd_scan_common(const OpArgs& a, int xi) {
  SsdScanShape s{};
  s.attrs = a.attrs<ops::SsdScanAttrs>();
  if (s.attrs.chunk_size == 0) s.attrs.chunk_size = 64;
  const ops::SsdScanAttrs& at = s.attrs;
  if (at.head_dim < 1) a.fail("head_dim = " + std::to_string(at.head_dim) + " must be >= 1");
  if (at.state_dim < 1) a.fail("state_dim = " + std::to_string(at.state_dim) + " must be >= 1");
  if (at.num_groups < 1) a.fail("num_groups = " + std::to_string(at.num_groups) + " must be >= 1");
  if (at.chunk_size < 1)
    a.fail("chunk_size = " + std::to_string(at.chunk_size) +
           " must be >= 1 (or 0: the kernel's choice)");
  if (at.dt_softplus != 0 && at.dt_softplus != 1)
    a.fail("dt_softplus = " + std::to_string(at.dt_softplus) + " must be 0 or 1");
  s.p = at.head_dim;
  s.n = at.state_dim;
  s.g = at.num_groups;
  const TensorView& xbc = a.float_in(xi);
  const DType dt = xbc.dtype;
  const TensorView& dt_in = mamba_detail::same_dtype_in(a, xi + 1, dt, "xBC");
  if (dt_in.ndim != 3)
    a.fail(a.in_label(xi + 1) + " has shape " + view_shape_str(dt_in) + ", expected (B, T, H)");
  s.b = dt_in.shape[0];
  s.t = dt_in.shape[1];
  s.h = dt_in.shape[2];
  if (s.h % s.g != 0)
    a.fail("num_groups = " + std::to_string(s.g) + " must divide the heads H = " +
           std::to_string(s.h) + " (" + a.in_label(xi + 1) + " is " + view_shape_str(dt_in) + ")");
  const int64_t hg = s.h / s.g;
  a.shape_in(xi, {s.b, s.t, s.g, hg * s.p + 2 * s.n}, "(B, T, G, HG * P + 2N)");
  mamba_detail::same_dtype_in(a, xi + 2, dt, "xBC");
  a.shape_in(xi + 2, {s.h}, "(H)");
  if (mamba_detail::opt_same_dtype_in(a, xi + 3, dt, "xBC") != nullptr)
    a.shape_in(xi + 3, {s.h}, "(H)");
  if (mamba_detail::opt_same_dtype_in(a, xi + 4, dt, "xBC") != nullptr)
    a.shape_in(xi + 4, {s.h}, "(H)");
  if (a.opt_f32_in(xi + 5) != nullptr) a.shape_in(xi + 5, {s.b, s.h, s.p, s.n}, "(B, H, P, N)");
  return s;
}

/// ssd_scan: xBC (B, T, G, HG * P + 2N), dt_in (B, T, H), A_log (H), D (H) or empty,
/// dt_bias (H) or empty, initial_state f32 (B, H, P, N) or empty -> y (B, T, H, P) of xBC's
/// dtype, final_state f32 (B, H, P, N) or empty (may be initial_state itself, no other input).
inline SsdScanShape check_ssd_scan(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSsdScan, {"xBC", "dt_in", "A_log", "D", "dt_bias", "initial_state"},
           {"y", "final_state"}, shapes_only, device);
  SsdScanShape s = check_ssd_scan_common(a, 0);
  const DType dt = a.in(0).dtype;
  mamba_detail::same_dtype_out(a, 0, dt, "xBC");
  a.shape_out(0, {s.b, s.t, s.h, s.p}, "(B, T, H, P)");
  if (a.opt_f32_out(1) != nullptr) {
    a.shape_out(1, {s.b, s.h, s.p, s.n}, "(B, H, P, N)");
    if (!shapes_only)
      for (int i = 0; i < 6; ++i) {
        if (!a.has_in(i) || !mamba_detail::overlaps(a.out(1), a.in(i))) continue;
        if (i == 5 && a.out(1).data == a.in(5).data) continue;  // the decoding alias
        a.fail(a.out_label(1) + " overlaps " + a.in_label(i) +
               ": the final state may alias the initial state only, and only exactly");
      }
  }
  return s;
}

/// ssd_scan_bwd: dy (B, T, H, P), xBC, dt_in, A_log, D or empty, dt_bias or empty,
/// initial_state or empty -> dxBC (B, T, G, HG * P + 2N), ddt_in (B, T, H) of xBC's dtype,
/// dA_log f32 (H) +=, dD f32 (H) += (exactly when D), ddt_bias f32 (H) += (exactly when
/// dt_bias).
inline SsdScanShape check_ssd_scan_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSsdScanBwd, {"dy", "xBC", "dt_in", "A_log", "D", "dt_bias", "initial_state"},
           {"dxBC", "ddt_in", "dA_log", "dD", "ddt_bias"}, shapes_only, device);
  SsdScanShape s = check_ssd_scan_common(a, 1);
  const DType dt = a.in(1).dtype;
  const int64_t hg = s.h / s.g;
  mamba_detail::same_dtype_in(a, 0, dt, "xBC");
  a.shape_in(0, {s.b, s.t, s.h, s.p}, "(B, T, H, P)");
  mamba_detail::same_dtype_out(a, 0, dt, "xBC");
  a.shape_out(0, {s.b, s.t, s.g, hg * s.p + 2 * s.n}, "(B, T, G, HG * P + 2N)");
  mamba_detail::same_dtype_out(a, 1, dt, "xBC");
  a.shape_out(1, {s.b, s.t, s.h}, "(B, T, H)");
  a.f32_out(2);
  a.shape_out(2, {s.h}, "(H)");
  mamba_detail::grad_iff(a, 3, 4);
  if (a.opt_f32_out(3) != nullptr) a.shape_out(3, {s.h}, "(H)");
  mamba_detail::grad_iff(a, 4, 5);
  if (a.opt_f32_out(4) != nullptr) a.shape_out(4, {s.h}, "(H)");
  return s;
}

// ---------------------------------------------------------------------------------------
// rmsnorm_gated
// ---------------------------------------------------------------------------------------

/// The problem a rmsnorm_gated / rmsnorm_gated_bwd call describes: rows (n) of c channels
/// in norm groups of group_size.
struct RmsNormGatedShape {
  int64_t n, c, group_size;
  ops::RmsNormGatedAttrs attrs;
};

/// The checks both directions share: y at input `yi`, z at yi + 1, weight at yi + 2. y may
/// have any leading dimensions (N is their product, as for rmsnorm_fwd).
inline RmsNormGatedShape check_rmsnorm_gated_common(const OpArgs& a, int yi) {
  RmsNormGatedShape s{};
  s.attrs = a.attrs<ops::RmsNormGatedAttrs>();
  const TensorView& y = a.float_in(yi);
  a.rank_in(yi, 1, "(N, C)");
  s.n = rows_of(y);
  s.c = last_dim(y);
  s.group_size = s.attrs.group_size;
  if (s.group_size < 1 || s.c % s.group_size != 0)
    a.fail("group_size = " + std::to_string(s.group_size) +
           " must be >= 1 and divide C = " + std::to_string(s.c));
  if (!(s.attrs.eps >= 0.0f)) a.fail("eps = " + std::to_string(s.attrs.eps) + " must be >= 0");
  mamba_detail::same_dtype_in(a, yi + 1, y.dtype, "y");
  a.numel_in(yi + 1, s.n * s.c, "y's shape (N, C)");
  mamba_detail::same_dtype_in(a, yi + 2, y.dtype, "y");
  a.shape_in(yi + 2, {s.c}, "(C)");
  return s;
}

/// rmsnorm_gated: y (N, C), z (N, C), weight (C) -> out (N, C) of y's dtype,
/// rstd f32 (N, C / group_size).
inline RmsNormGatedShape check_rmsnorm_gated(const OpCall* call, bool shapes_only,
                                             DeviceType device) {
  OpArgs a(call, ops::kRmsNormGated, {"y", "z", "weight"}, {"out", "rstd"}, shapes_only, device);
  RmsNormGatedShape s = check_rmsnorm_gated_common(a, 0);
  mamba_detail::same_dtype_out(a, 0, a.in(0).dtype, "y");
  a.numel_out(0, s.n * s.c, "y's shape (N, C)");
  a.f32_out(1);
  a.numel_out(1, s.n * (s.c / s.group_size), "(N, C / group_size)");
  return s;
}

/// rmsnorm_gated_bwd: dout (N, C), y, z, weight, rstd f32 (N, C / group_size) -> dy (N, C),
/// dz (N, C) of y's dtype, dweight f32 (C) +=.
inline RmsNormGatedShape check_rmsnorm_gated_bwd(const OpCall* call, bool shapes_only,
                                                 DeviceType device) {
  OpArgs a(call, ops::kRmsNormGatedBwd, {"dout", "y", "z", "weight", "rstd"},
           {"dy", "dz", "dweight"}, shapes_only, device);
  RmsNormGatedShape s = check_rmsnorm_gated_common(a, 1);
  const DType dt = a.in(1).dtype;
  mamba_detail::same_dtype_in(a, 0, dt, "y");
  a.numel_in(0, s.n * s.c, "y's shape (N, C)");
  a.f32_in(4);
  a.numel_in(4, s.n * (s.c / s.group_size), "(N, C / group_size)");
  mamba_detail::same_dtype_out(a, 0, dt, "y");
  a.numel_out(0, s.n * s.c, "y's shape (N, C)");
  mamba_detail::same_dtype_out(a, 1, dt, "y");
  a.numel_out(1, s.n * s.c, "y's shape (N, C)");
  a.f32_out(2);
  a.shape_out(2, {s.c}, "(C)");
  return s;
}

}  // namespace loom::op_checks
