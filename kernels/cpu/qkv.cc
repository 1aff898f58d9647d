// Head layout ops (loom/ops.h): swap_axes_12 ((B, T, H, D) <-> (B, H, T, D)), and
// split_qkv / merge_qkv, Megatron's grouped fused-QKV layout. Each of the G
// groups of X's last dimension holds its H/G query heads, then its key head, then its
// value head, D channels each: X (B, T, G, (H/G + 2) * D).
//   reference: element by element through the index map.
//   fast: OpenMP over tokens, whole heads converted at a time.
#include <cstring>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

struct QkvShape {
  int64_t bt, h, g, d;  // bt = B * T tokens
};

// X is input 0 of split_qkv and output 0 of merge_qkv; Q, K, V the other side.
QkvShape check_qkv(const OpCall* call, bool shapes_only, bool merge) {
  Args a = merge ? Args(call, ops::kMergeQkv, {"dQ", "dK", "dV"}, {"dX"}, shapes_only)
                 : Args(call, ops::kSplitQkv, {"X"}, {"Q", "K", "V"}, shapes_only);
  const TensorView& X = merge ? a.float_out(0) : a.float_in(0);
  const TensorView& Q = merge ? a.float_in(0) : a.float_out(0);
  const TensorView& K = merge ? a.float_in(1) : a.float_out(1);
  const TensorView& V = merge ? a.float_in(2) : a.float_out(2);
  std::string q_label = merge ? a.in_label(0) : a.out_label(0);
  std::string k_label = merge ? a.in_label(1) : a.out_label(1);
  if (Q.ndim != 4) a.fail(q_label + " has shape " + shape_str(Q) + ", expected (B, T, H, D)");
  if (K.ndim != 4) a.fail(k_label + " has shape " + shape_str(K) + ", expected (B, T, G, D)");
  int64_t B = Q.shape[0], T = Q.shape[1], H = Q.shape[2], D = Q.shape[3], G = K.shape[2];
  if (G <= 0 || H % G != 0)
    a.fail(k_label + " has shape " + shape_str(K) + ": its G = " + std::to_string(G) +
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
QkvShape check_split_qkv(const OpCall* c, bool s) { return check_qkv(c, s, false); }
QkvShape check_merge_qkv(const OpCall* c, bool s) { return check_qkv(c, s, true); }

// Calls f(x_offset, tensor_index (0 Q, 1 K, 2 V), offset in that tensor) for the first
// element of every head of token `token`; each head is D contiguous elements on both sides.
template <class F>
void for_each_head(const QkvShape& s, int64_t token, F&& f) {
  int64_t q_per_g = s.h / s.g, group = (q_per_g + 2) * s.d;
  for (int64_t g = 0; g < s.g; ++g) {
    int64_t x0 = (token * s.g + g) * group;
    for (int64_t j = 0; j < q_per_g; ++j) f(x0 + j * s.d, 0, (token * s.h + g * q_per_g + j) * s.d);
    f(x0 + q_per_g * s.d, 1, (token * s.g + g) * s.d);
    f(x0 + (q_per_g + 1) * s.d, 2, (token * s.g + g) * s.d);
  }
}

Status split_qkv_ref(const OpCall* call) {
  return guard([&] {
    QkvShape s = check_split_qkv(call, false);
    for (int64_t t = 0; t < s.bt; ++t)
      for_each_head(s, t, [&](int64_t x0, int which, int64_t o0) {
        for (int64_t i = 0; i < s.d; ++i)
          store(call->outputs[which], o0 + i, load(call->inputs[0], x0 + i));
      });
  });
}

Status merge_qkv_ref(const OpCall* call) {
  return guard([&] {
    QkvShape s = check_merge_qkv(call, false);
    for (int64_t t = 0; t < s.bt; ++t)
      for_each_head(s, t, [&](int64_t x0, int which, int64_t o0) {
        for (int64_t i = 0; i < s.d; ++i)
          store(call->outputs[0], x0 + i, load(call->inputs[which], o0 + i));
      });
  });
}

Status split_qkv_fast(const OpCall* call) {
  return guard([&] {
    QkvShape s = check_split_qkv(call, false);
    const TensorView& X = call->inputs[0];
#pragma omp parallel
    {
      std::vector<float> head(static_cast<size_t>(s.d));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < s.bt; ++t)
        for_each_head(s, t, [&](int64_t x0, int which, int64_t o0) {
          const TensorView& O = call->outputs[which];
          load_row(X.data, X.dtype, x0, s.d, head.data());
          store_row(O.data, O.dtype, o0, s.d, head.data());
        });
    }
  });
}

Status merge_qkv_fast(const OpCall* call) {
  return guard([&] {
    QkvShape s = check_merge_qkv(call, false);
    const TensorView& X = call->outputs[0];
#pragma omp parallel
    {
      std::vector<float> head(static_cast<size_t>(s.d));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < s.bt; ++t)
        for_each_head(s, t, [&](int64_t x0, int which, int64_t o0) {
          const TensorView& I = call->inputs[which];
          load_row(I.data, I.dtype, o0, s.d, head.data());
          store_row(X.data, X.dtype, x0, s.d, head.data());
        });
    }
  });
}

// ---- swap_axes_12: Y[a, j, i, d] = X[a, i, j, d], any dtype of 2 or 4 bytes -------------

struct SwapShape {
  int64_t a, i, j, d;
  size_t bytes;  // of one element
};

SwapShape check_swap_axes(const OpCall* call, bool shapes_only) {
  Args a(call, ops::kSwapAxes12, {"X"}, {"Y"}, shapes_only);
  const TensorView &X = a.in(0), &Y = a.out(0);
  if (!a.has_in(0) || !a.has_out(0)) a.fail("X and Y are required");
  size_t bytes = dtype_size(X.dtype);
  if (bytes != 2 && bytes != 4)
    a.fail(a.in_label(0) + " has dtype " + dtype_name(X.dtype) + ": expected one of 2 or 4 bytes");
  if (Y.dtype != X.dtype)
    a.fail(a.out_label(0) + " has dtype " + dtype_name(Y.dtype) + ", expected X's " +
           dtype_name(X.dtype) + " (use cast to convert)");
  if (!is_contiguous(X) || !is_contiguous(Y)) a.fail("X and Y must be contiguous");
  if (X.ndim != 4) a.fail(a.in_label(0) + " has shape " + shape_str(X) + ", expected (A, I, J, D)");
  SwapShape s{X.shape[0], X.shape[1], X.shape[2], X.shape[3], bytes};
  a.shape_out(0, {s.a, s.j, s.i, s.d}, "(A, J, I, D)");
  if (!shapes_only && numel(X) > 0 && (X.data == nullptr || Y.data == nullptr))
    a.fail("X or Y has null data");
  if (!shapes_only && X.data == Y.data && numel(X) > 0)
    a.fail("Y must not alias X (a transpose cannot run in place)");
  return s;
}

Status swap_axes_12_ref(const OpCall* call) {
  return guard([&] {
    SwapShape s = check_swap_axes(call, false);
    const char* x = static_cast<const char*>(call->inputs[0].data);
    char* y = static_cast<char*>(call->outputs[0].data);
    for (int64_t a = 0; a < s.a; ++a)
      for (int64_t i = 0; i < s.i; ++i)
        for (int64_t j = 0; j < s.j; ++j)
          for (int64_t d = 0; d < s.d; ++d)
            std::memcpy(y + (((a * s.j + j) * s.i + i) * s.d + d) * s.bytes,
                        x + (((a * s.i + i) * s.j + j) * s.d + d) * s.bytes, s.bytes);
  });
}

Status swap_axes_12_fast(const OpCall* call) {
  return guard([&] {
    SwapShape s = check_swap_axes(call, false);
    const char* x = static_cast<const char*>(call->inputs[0].data);
    char* y = static_cast<char*>(call->outputs[0].data);
    size_t row = static_cast<size_t>(s.d) * s.bytes;  // D contiguous elements move together
#pragma omp parallel for schedule(static) collapse(2)
    for (int64_t a = 0; a < s.a; ++a)
      for (int64_t j = 0; j < s.j; ++j)
        for (int64_t i = 0; i < s.i; ++i)
          std::memcpy(y + ((a * s.j + j) * s.i + i) * row, x + ((a * s.i + i) * s.j + j) * row,
                      row);
  });
}

LOOM_CPU_HOOKS(swap_axes_12, check_swap_axes, 0)
LOOM_CPU_HOOKS(split_qkv, check_split_qkv, 0)
LOOM_CPU_HOOKS(merge_qkv, check_merge_qkv, 0)

}  // namespace

void add_qkv_kernels(std::vector<KernelDesc>& out) {
  size_t first = out.size();
  LOOM_CPU_REGISTER(out, ops::kSwapAxes12, swap_axes_12);
  // Also for i32 tensors (the op moves any 2- or 4-byte dtype).
  for (size_t i = first, end = out.size(); i < end; ++i)
    if (out[i].dtype == DType::kF32) {
      KernelDesc k = out[i];
      k.dtype = DType::kI32;
      out.push_back(k);
    }
  LOOM_CPU_REGISTER(out, ops::kSplitQkv, split_qkv);
  LOOM_CPU_REGISTER(out, ops::kMergeQkv, merge_qkv);
}

}  // namespace loom::kernels::cpu
