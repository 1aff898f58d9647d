// The output of a fused QKV projection seen as attention's q, k and v without copies
// (attention 1.2, ABI 1.10: loom/kinds/attention.h).
//
// With as many key/value heads as query heads (MHA), Megatron's grouped layout
// X (B, T, G, (H / G + 2) * D) is X (B, T, H, 3 D): head h's q, k and v are consecutive D
// elements. Each of q, k, v is then a strided (B, T, H, D) view of X, with row strides
// (T H 3D, H 3D, 3D), at offsets 0, D and 2D. The attention ops take such views in place
// (ops::kAttentionFwd), so a layer needs no split_qkv before attention and no merge_qkv
// after its backward. With fewer groups (GQA, MQA) q is no 4-D view of X; the layer splits.
//
//   QkvViews qkv;
//   if (fused_qkv_views(x, &qkv)) ... pass qkv.q, qkv.k, qkv.v to the attention core
//   TensorView dx = fused_qkv_of(dq, dk, dv);  // the gradient's X, or empty when separate
#pragma once

#include <loom/cpp/nn/views.h>
#include <loom/ops.h>
#include <loom/types.h>
#include <stdint.h>

namespace loom::nn {

/// Attention's q, k and v (each (B, T, H, D)) as views of one fused tensor.
struct QkvViews {
  TensorView q, k, v;
};

/// Makes the views q, k, v of `x` (B, T, H, 3 D), packed, the MHA case of the grouped QKV
/// layout. Returns false (leaving `out` untouched) when `x` is not a packed 4-D tensor
/// whose last extent is a positive multiple of 3.
/// \param x    the fused projection's output (or its gradient), (B, T, H, 3 D)
/// \param out  the three views
inline bool fused_qkv_views(const TensorView& x, QkvViews* out) {
  if (x.ndim != 4 || x.shape[3] <= 0 || x.shape[3] % 3 != 0 || !is_contiguous(x)) return false;
  const int64_t d = x.shape[3] / 3;
  const size_t bytes = dtype_size(x.dtype);
  TensorView q = x;
  q.shape[3] = d;
  q.strides[0] = x.shape[1] * x.shape[2] * 3 * d;
  q.strides[1] = x.shape[2] * 3 * d;
  q.strides[2] = 3 * d;
  q.strides[3] = 1;
  TensorView k = q, v = q;
  if (x.data != nullptr) {
    k.data = static_cast<char*>(x.data) + d * bytes;
    v.data = static_cast<char*>(x.data) + 2 * d * bytes;
  }
  *out = QkvViews{q, k, v};
  return true;
}

/// The fused tensor X (B, T, H, 3 D) whose views (fused_qkv_views) `q`, `k` and `v` are, or
/// an empty view (data null, ndim 0) when they are anything else: separate tensors, other
/// strides, other offsets. A packed tensor never passes for a view (a view of X is strided
/// unless B = T = H = 1, which this reports as separate), so the answer is unambiguous:
/// when it is not empty, the three share one allocation.
inline TensorView fused_qkv_of(const TensorView& q, const TensorView& k, const TensorView& v) {
  TensorView none{};
  if (q.data == nullptr || q.ndim != 4 || k.ndim != 4 || v.ndim != 4) return none;
  for (const TensorView* t : {&k, &v}) {
    if (t->dtype != q.dtype || t->device.type != q.device.type || t->device.index != q.device.index)
      return none;
    for (int i = 0; i < 4; ++i)
      if (t->shape[i] != q.shape[i]) return none;
  }
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], d = q.shape[3];
  if (d <= 0 || B * T * H <= 1) return none;
  const int64_t want[4] = {T * H * 3 * d, H * 3 * d, 3 * d, 1};
  for (const TensorView* t : {&q, &k, &v})
    for (int i = 0; i < 4; ++i)
      if (t->shape[i] != 1 && t->strides[i] != want[i]) return none;
  const size_t bytes = dtype_size(q.dtype);
  if (k.data != static_cast<char*>(q.data) + d * bytes ||
      v.data != static_cast<char*>(q.data) + 2 * d * bytes)
    return none;
  TensorView x = q;
  x.shape[3] = 3 * d;
  x.strides[3] = 1;
  x.strides[2] = 3 * d;
  x.strides[1] = H * 3 * d;
  x.strides[0] = T * H * 3 * d;
  return x;
}

/// An attention module's input check (attention 1.2): q (B, T, H, D), k and v (B, S, G, D)
/// of `dtype`, packed, or the three views of one fused tensor (then returned; an empty
/// view when they are packed). Throws kInvalidArgument naming `what` otherwise.
inline TensorView expect_qkv(const TensorView& q, const TensorView& k, const TensorView& v,
                             DType dtype, const std::string& what) {
  TensorView fused = fused_qkv_of(q, k, v);
  if (present(fused)) {
    expect(fused, {-1, -1, -1, -1}, dtype, (what + " fused q, k, v").c_str());
    return fused;
  }
  expect(q, {-1, -1, -1, -1}, dtype, (what + " q").c_str());
  expect(k, {q.shape[0], -1, -1, q.shape[3]}, dtype, (what + " k").c_str());
  expect(v, {q.shape[0], k.shape[1], k.shape[2], q.shape[3]}, dtype, (what + " v").c_str());
  return fused;
}

/// Packed copies of the views of `fused` (B, T, H, 3 D), by `split` (the split_qkv op of
/// fused's device and dtype), for a module that needs packed q, k, v (a reference
/// composition of ops, context parallelism's ring). The caller releases the three.
inline QkvViews packed_qkv(IForwardContext& ctx, const Kernel& split, const TensorView& fused) {
  const int64_t b = fused.shape[0], t = fused.shape[1], h = fused.shape[2], d = fused.shape[3] / 3;
  QkvViews out{allocate(ctx, fused.dtype, {b, t, h, d}, fused.device),
               allocate(ctx, fused.dtype, {b, t, h, d}, fused.device),
               allocate(ctx, fused.dtype, {b, t, h, d}, fused.device)};
  split({fused}, {out.q, out.k, out.v});
  return out;
}

}  // namespace loom::nn
