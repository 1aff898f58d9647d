// Head layout ops (loom/ops.h): swap_axes_12 ((B, T, H, D) <-> (B, H, T, D)), and
// split_qkv / merge_qkv, Megatron's grouped fused-QKV layout. Each of the G
// groups of X's last dimension holds its H/G query heads, then its key head, then its
// value head, D channels each: X (B, T, G, (H/G + 2) * D).
//   reference: element by element through the index map.
//   fast: OpenMP over tokens, whole heads converted at a time.
#include <loom/cpp/op_checks/qkv.h>

#include <cstring>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::QkvShape;

QkvShape check_split_qkv(const OpCall* c, bool s) {
  return op_checks::check_split_qkv(c, s, DeviceType::kCpu);
}
QkvShape check_merge_qkv(const OpCall* c, bool s) {
  return op_checks::check_merge_qkv(c, s, DeviceType::kCpu);
}

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

using op_checks::SwapShape;

SwapShape check_swap_axes(const OpCall* c, bool s) {
  return op_checks::check_swap_axes(c, s, DeviceType::kCpu);
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
