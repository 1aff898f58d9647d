// Argument checks of the multi-latent attention layout ops (loom/ops/mla.h: mla_qkv,
// mla_qkv_bwd, mla_out, mla_out_bwd), shared by every kernel library so that all of them
// refuse a bad call with the same words (header-only; see loom/cpp/op_args.h). Every tensor
// of a call has the dtype of its first input; outputs must not overlap inputs or each other
// (the kernels copy without staging).
#pragma once

#include <stdint.h>

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/cpp/op_checks/mamba.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// The problem an MLA layout call describes; D = attrs.nope_dim + attrs.rope_dim.
struct MlaShape {
  int64_t b, t, h;  ///< batch, tokens, heads
  ops::MlaAttrs attrs;
};

namespace mla_detail {

using mamba_detail::overlaps;
using mamba_detail::same_dtype_in;
using mamba_detail::same_dtype_out;

/// The attributes, checked: dn >= 1, dr >= 0, 1 <= dv <= dn + dr.
inline ops::MlaAttrs check_attrs(const OpArgs& a) {
  const ops::MlaAttrs m = a.attrs<ops::MlaAttrs>();
  if (m.nope_dim < 1) a.fail("nope_dim = " + std::to_string(m.nope_dim) + " must be >= 1");
  if (m.rope_dim < 0) a.fail("rope_dim = " + std::to_string(m.rope_dim) + " must be >= 0");
  if (m.v_dim < 1 || static_cast<int64_t>(m.v_dim) > static_cast<int64_t>(m.nope_dim) + m.rope_dim)
    a.fail("v_dim = " + std::to_string(m.v_dim) + " must be in [1, nope_dim + rope_dim = " +
           std::to_string(static_cast<int64_t>(m.nope_dim) + m.rope_dim) + "]");
  return m;
}

/// Input i, a (B, T, H, last) float tensor that fixes B, T and H of `s`.
inline void first_in(const OpArgs& a, int i, int64_t last, const char* expect, MlaShape& s) {
  const TensorView& v = a.float_in(i);
  if (v.ndim != 4 || v.shape[3] != last)
    a.fail(a.in_label(i) + " has shape " + view_shape_str(v) + ", expected " + expect +
           " with last extent " + std::to_string(last));
  s.b = v.shape[0];
  s.t = v.shape[1];
  s.h = v.shape[2];
}

/// Refuses an output that overlaps an input or an earlier output (data only, so not when
/// checking shapes alone).
inline void no_aliasing(const OpArgs& a, int num_in, int num_out) {
  if (a.shapes_only()) return;
  for (int o = 0; o < num_out; ++o) {
    for (int i = 0; i < num_in; ++i)
      if (overlaps(a.out(o), a.in(i)))
        a.fail(a.out_label(o) + " overlaps " + a.in_label(i) + ": outputs must not alias inputs");
    for (int p = 0; p < o; ++p)
      if (overlaps(a.out(o), a.out(p)))
        a.fail(a.out_label(o) + " overlaps " + a.out_label(p) +
               ": outputs must not alias each other");
  }
}

}  // namespace mla_detail

/// mla_qkv: q (B, T, H, dn + dr), kv (B, T, H, dn + dv), kpe (B, T, dr) -> Q, K, V
/// (B, T, H, D); all of q's dtype.
inline MlaShape check_mla_qkv(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMlaQkv, {"q", "kv", "kpe"}, {"Q", "K", "V"}, shapes_only, device);
  MlaShape s{};
  s.attrs = mla_detail::check_attrs(a);
  const int64_t dn = s.attrs.nope_dim, dr = s.attrs.rope_dim, dv = s.attrs.v_dim, d = dn + dr;
  mla_detail::first_in(a, 0, d, "(B, T, H, dn + dr)", s);
  const DType dt = a.in(0).dtype;
  mla_detail::same_dtype_in(a, 1, dt, "q");
  a.shape_in(1, {s.b, s.t, s.h, dn + dv}, "(B, T, H, dn + dv)");
  mla_detail::same_dtype_in(a, 2, dt, "q");
  a.shape_in(2, {s.b, s.t, dr}, "(B, T, dr)");
  for (int o = 0; o < 3; ++o) {
    mla_detail::same_dtype_out(a, o, dt, "q");
    a.shape_out(o, {s.b, s.t, s.h, d}, "(B, T, H, dn + dr)");
  }
  mla_detail::no_aliasing(a, 3, 3);
  return s;
}

/// mla_qkv_bwd: dQ, dK, dV (B, T, H, D) -> dq (B, T, H, dn + dr), dkv (B, T, H, dn + dv),
/// dkpe (B, T, dr); all of dQ's dtype.
inline MlaShape check_mla_qkv_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMlaQkvBwd, {"dQ", "dK", "dV"}, {"dq", "dkv", "dkpe"}, shapes_only, device);
  MlaShape s{};
  s.attrs = mla_detail::check_attrs(a);
  const int64_t dn = s.attrs.nope_dim, dr = s.attrs.rope_dim, dv = s.attrs.v_dim, d = dn + dr;
  mla_detail::first_in(a, 0, d, "(B, T, H, dn + dr)", s);
  const DType dt = a.in(0).dtype;
  for (int i = 1; i < 3; ++i) {
    mla_detail::same_dtype_in(a, i, dt, "dQ");
    a.shape_in(i, {s.b, s.t, s.h, d}, "(B, T, H, dn + dr)");
  }
  mla_detail::same_dtype_out(a, 0, dt, "dQ");
  a.shape_out(0, {s.b, s.t, s.h, d}, "(B, T, H, dn + dr)");
  mla_detail::same_dtype_out(a, 1, dt, "dQ");
  a.shape_out(1, {s.b, s.t, s.h, dn + dv}, "(B, T, H, dn + dv)");
  mla_detail::same_dtype_out(a, 2, dt, "dQ");
  a.shape_out(2, {s.b, s.t, dr}, "(B, T, dr)");
  mla_detail::no_aliasing(a, 3, 3);
  return s;
}

/// mla_out: O (B, T, H, D) -> Y (B, T, H, dv) of O's dtype.
inline MlaShape check_mla_out(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMlaOut, {"O"}, {"Y"}, shapes_only, device);
  MlaShape s{};
  s.attrs = mla_detail::check_attrs(a);
  const int64_t d = static_cast<int64_t>(s.attrs.nope_dim) + s.attrs.rope_dim;
  mla_detail::first_in(a, 0, d, "(B, T, H, dn + dr)", s);
  mla_detail::same_dtype_out(a, 0, a.in(0).dtype, "O");
  a.shape_out(0, {s.b, s.t, s.h, s.attrs.v_dim}, "(B, T, H, dv)");
  mla_detail::no_aliasing(a, 1, 1);
  return s;
}

/// mla_out_bwd: dY (B, T, H, dv) -> dO (B, T, H, D) of dY's dtype.
inline MlaShape check_mla_out_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMlaOutBwd, {"dY"}, {"dO"}, shapes_only, device);
  MlaShape s{};
  s.attrs = mla_detail::check_attrs(a);
  const int64_t d = static_cast<int64_t>(s.attrs.nope_dim) + s.attrs.rope_dim;
  mla_detail::first_in(a, 0, s.attrs.v_dim, "(B, T, H, dv)", s);
  mla_detail::same_dtype_out(a, 0, a.in(0).dtype, "dY");
  a.shape_out(0, {s.b, s.t, s.h, d}, "(B, T, H, dn + dr)");
  mla_detail::no_aliasing(a, 1, 1);
  return s;
}

}  // namespace loom::op_checks
