// attention_merge on CUDA (loom/ops.h): folds one block's (O_part, lse_part) into the running
// (O, lse) of context-parallel attention. One warp per row (b, t, h): lane 0's weights are
// computed by every lane (the same two exponentials), then the lanes update columns
// d = lane, lane + 32, ... of the row. f32 arithmetic; the CPU reference uses f64.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/attention.h>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/attention_device.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/registration.h"

namespace loom::kernels::cuda {
namespace {

using attn::AnyIo;

struct MergeParams {
  const void* part;
  const float* lse_part;
  void* o;
  float* lse;
  DType dt_part, dt_o;
  int64_t b, t, h, d;
};

constexpr int kWarps = 4;

__global__ void attention_merge_kernel(const MergeParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= p.b * p.t * p.h) return;
  // row indexes (B, T, H); lse is (B, H, T).
  const int64_t h = row % p.h, t = (row / p.h) % p.t, b = row / (p.h * p.t);
  const int64_t r = (b * p.h + h) * p.t + t;
  const float lp = p.lse_part[r], lo = p.lse[r];
  if (lp == -INFINITY) return;  // nothing visible in this block
  const float m = fmaxf(lo, lp);
  const float merged = m + logf(expf(lo - m) + expf(lp - m));
  const float wo = lo == -INFINITY ? 0.0f : expf(lo - merged);
  const float wp = expf(lp - merged);
  for (int64_t i = lane; i < p.d; i += 32) {
    const int64_t at = row * p.d + i;
    const float old = wo == 0.0f ? 0.0f : wo * AnyIo::load(p.o, p.dt_o, at);
    AnyIo::store(p.o, p.dt_o, at, old + wp * AnyIo::load(p.part, p.dt_part, at));
  }
  __syncwarp();
  if (lane == 0) p.lse[r] = merged;
}

Status attention_merge_cuda(const OpCall* call) {
  return guard([&] {
    auto s = op_checks::check_attention_merge(call, false, DeviceType::kCuda);
    MergeParams p{call->inputs[0].data,
                  static_cast<const float*>(call->inputs[1].data),
                  call->outputs[0].data,
                  static_cast<float*>(call->outputs[1].data),
                  call->inputs[0].dtype,
                  call->outputs[0].dtype,
                  s.b,
                  s.t,
                  s.h,
                  s.d};
    const int64_t rows = s.b * s.t * s.h;
    if (rows == 0) return;
    attention_merge_kernel<<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), 32 * kWarps, 0,
                             stream_of(call)>>>(p);
    launch_check(ops::kAttentionMerge);
  });
}

bool attention_merge_supports(const OpCall* call) {
  return check_passes(
      [&] { op_checks::check_attention_merge(call, true, DeviceType::kCuda); });
}

Status attention_merge_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    auto s = op_checks::check_attention_merge(call, true, DeviceType::kCuda);
    *out = io_cost(call, 4.0 * static_cast<double>(s.b * s.t * s.h * s.d));
  });
}

}  // namespace

void add_attention_merge_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kAttentionMerge, attention_merge_cuda, attention_merge_supports,
                   attention_merge_cost);
}

}  // namespace loom::kernels::cuda
