// split_qkv / merge_qkv (loom/ops.h): Megatron's grouped fused-QKV layout. X (B, T, G,
// (H/G + 2) * D) holds, in each of the G groups of a token, its H/G query heads, then its
// key head, then its value head; split_qkv copies them into Q (B, T, H, D), K and V
// (B, T, G, D), merge_qkv (the backward) copies them back.
//
// Algorithm: a head is D contiguous elements on both sides, so head r of X (in X's order)
// goes whole to one place: slot s = r % (H/G + 2) of group g = (r / (H/G + 2)) % G of token
// t = r / ((H/G + 2) G) is query head g H/G + s, or the group's key (s = H/G) or value head.
//  - One dtype everywhere: a raw copy in the widest unit (16, 8, 4 or 2 bytes) that divides
//    a head's bytes and every address.
//  - Mixed dtypes (each tensor may have its own float dtype): element by element with
//    conversion, as the CPU kernels do.
//
// Launch: one thread per unit (or element) of X, 256 threads per block, grid-striding;
// consecutive threads touch consecutive units of a head on both sides. The raw copy
// (qkv_kernel.cuh) indexes in 32 bits below 2^31 units, with two divisions a unit; the
// conversion, 64-bit indices.
#include <loom/cpp/op_checks/qkv.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/qkv_kernel.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

// Where head r of X lives among Q, K, V: tensor (0, 1, 2) and head index in it.
struct HeadPlace {
  int which;
  int64_t head;
};

__device__ __forceinline__ HeadPlace place_of(int64_t r, int64_t g_heads, int64_t q_per_g,
                                              int64_t h) {
  const int64_t slot = r % (q_per_g + 2), tg = r / (q_per_g + 2);
  const int64_t g = tg % g_heads, t = tg / g_heads;
  if (slot < q_per_g) return {0, t * h + g * q_per_g + slot};
  return {slot == q_per_g ? 1 : 2, tg};  // tg = t * G + g: the token's group
}

// Mixed dtypes: element by element, converting through f32.
struct QkvTensors {
  void* ptr[4];  // X, Q, K, V
  DType dtype[4];
};

__global__ void qkv_convert_kernel(QkvTensors ts, int64_t x_heads, int64_t d, int64_t g_heads,
                                   int64_t q_per_g, int64_t h, bool merge) {
  const int64_t n = x_heads * d;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / d, e = i - r * d;
    const HeadPlace p = place_of(r, g_heads, q_per_g, h);
    // Selected by value, not by a run-time index into `ts` (which would go through local
    // memory).
    void* other = p.which == 0 ? ts.ptr[1] : p.which == 1 ? ts.ptr[2] : ts.ptr[3];
    const DType ot = p.which == 0 ? ts.dtype[1] : p.which == 1 ? ts.dtype[2] : ts.dtype[3];
    const int64_t j = p.head * d + e;
    if (merge)
      store_elem(ts.ptr[0], ts.dtype[0], i, load_elem(other, ot, j));
    else
      store_elem(other, ot, j, load_elem(ts.ptr[0], ts.dtype[0], i));
  }
}

void launch_qkv(const OpCall* call, const op_checks::QkvShape& s, bool merge, const char* op) {
  const int64_t q_per_g = s.h / s.g, x_heads = s.bt * s.g * (q_per_g + 2);
  if (x_heads == 0 || s.d == 0) return;
  const TensorView& X = merge ? call->outputs[0] : call->inputs[0];
  const TensorView* qkv = merge ? call->inputs : call->outputs;  // Q, K, V
  QkvTensors ts{{X.data, qkv[0].data, qkv[1].data, qkv[2].data},
                {X.dtype, qkv[0].dtype, qkv[1].dtype, qkv[2].dtype}};
  const bool same = ts.dtype[1] == X.dtype && ts.dtype[2] == X.dtype && ts.dtype[3] == X.dtype;
  if (same) {
    const int64_t row_bytes = s.d * static_cast<int64_t>(dtype_size(X.dtype));
    const int unit = copy_unit(row_bytes, {ts.ptr[0], ts.ptr[1], ts.ptr[2], ts.ptr[3]});
    const int64_t per_head = row_bytes / unit;
    const int64_t n = x_heads * per_head;
    LOOM_POINTWISE_UNIT_SWITCH(unit, U, {
      U* x = static_cast<U*>(ts.ptr[0]);
      U* q = static_cast<U*>(ts.ptr[1]);
      U* k = static_cast<U*>(ts.ptr[2]);
      U* v = static_cast<U*>(ts.ptr[3]);
      const unsigned grid = grid_for(n, kFlatThreads);
      if (n < (int64_t{1} << 31))
        qkv_copy_kernel<U, uint32_t><<<grid, kFlatThreads, 0, stream_of(call)>>>(
            x, q, k, v, static_cast<uint32_t>(n), static_cast<uint32_t>(per_head),
            static_cast<uint32_t>(q_per_g), merge);
      else
        qkv_copy_kernel<U, int64_t>
            <<<grid, kFlatThreads, 0, stream_of(call)>>>(x, q, k, v, n, per_head, q_per_g, merge);
    });
  } else {
    qkv_convert_kernel<<<grid_for(x_heads * s.d, kFlatThreads), kFlatThreads, 0, stream_of(call)>>>(
        ts, x_heads, s.d, s.g, q_per_g, s.h, merge);
  }
  launch_check(op);
}

op_checks::QkvShape check_split(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_split_qkv(c, s, d);
}
op_checks::QkvShape check_merge(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_merge_qkv(c, s, d);
}

Status split_qkv(const OpCall* call) {
  return guard([&] {
    launch_qkv(call, check_split(call, false, DeviceType::kCuda), false, ops::kSplitQkv);
  });
}

Status merge_qkv(const OpCall* call) {
  return guard(
      [&] { launch_qkv(call, check_merge(call, false, DeviceType::kCuda), true, ops::kMergeQkv); });
}

LOOM_CUDA_HOOKS(split_qkv, check_split, 0)
LOOM_CUDA_HOOKS(merge_qkv, check_merge, 0)

}  // namespace

void add_qkv_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kSplitQkv, split_qkv, split_qkv_supports, split_qkv_cost);
  add_cuda_kernels(out, ops::kMergeQkv, merge_qkv, merge_qkv_supports, merge_qkv_cost);
}

}  // namespace loom::kernels::cuda::pointwise
