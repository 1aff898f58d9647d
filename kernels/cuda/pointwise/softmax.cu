// masked_softmax_fwd / masked_softmax_bwd (loom/ops.h), the reference attention core:
//   P = softmax(scale * S + mask) over the last dimension, key s hidden from query t when
//   causal and s > t + (Sk - T), or when the segment ids of t and s differ; a fully masked
//   row gives zeros. dS = scale * P * (dP - sum(dP * P)).
//
// Algorithm: one team per row of Sk scores (row_team.cuh), the row in registers: forward
// takes the row maximum (a team max), then exp(v - max) and its sum (a team sum), then
// writes exp / sum; backward sums dP * P, then writes. f32 throughout.
//
// Launch: teams of 32..512 threads per row (4 chunks of 4 per lane in the forward, 4 of dP
// and 4 of P in the backward), blocks of at least 256 threads, the grid striding over the
// B * H * T rows; 8- or 16-byte accesses when Sk % 4 == 0 and the tensors are aligned.
#include <loom/cpp/op_checks/softmax.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/row_team.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

constexpr int kFwdChunks = 4;
constexpr int kBwdChunks = 4;

struct SoftmaxArgs {
  const void* in0;     // S (forward) or dP (backward), (B, H, T, Sk)
  const void* in1;     // backward: P
  const int32_t* seg;  // forward: segment ids (B, T) or null
  void* out;           // P (forward) or dS (backward)
  DType t0, t1, to;
  int64_t rows, h, t, sk;
  float scale;
  bool causal;
  int tpr;
  bool vec;
};

__global__ void __launch_bounds__(kMaxTeam) softmax_fwd_kernel(SoftmaxArgs a) {
  __shared__ TeamScratch<1> scratch;
  const int team = threadIdx.x / a.tpr, lane = threadIdx.x % a.tpr;
  const int teams = blockDim.x / a.tpr;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * teams; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * teams) {
    const int64_t row = base + team;
    const bool active = row < a.rows;
    const int64_t off = (active ? row : 0) * a.sk, end = off + a.sk;
    const int64_t tq = (active ? row : 0) % a.t;  // the query
    const int32_t* seg =
        a.seg != nullptr ? a.seg + (active ? row : 0) / (a.h * a.t) * a.t : nullptr;
    const int32_t own = seg != nullptr ? seg[tq] : 0;
    const int64_t last = a.causal ? tq + (a.sk - a.t) : a.sk - 1;  // last visible key
    // Scaled, masked scores of a chunk; -inf for hidden keys, keys past Sk, idle teams.
    auto scores = [&](int64_t c, float v[4]) {
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (active) load4(a.in0, a.t0, off + c, end, a.vec, x);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t s = c + e;
        const bool hidden = !active || s >= a.sk || s > last || (seg != nullptr && seg[s] != own);
        v[e] = hidden ? -INFINITY : a.scale * x[e];
      }
    };
    float v[kFwdChunks][4];
    float m = -INFINITY;
    for_each_chunk<kFwdChunks>(lane, a.tpr, a.sk, [&](int k, int64_t c) {
      float t[4];
      scores(c, t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (k >= 0) v[k][e] = t[e];
        m = fmaxf(m, t[e]);
      }
    });
    m = team_max(m, a.tpr, scratch);
    const bool empty = m == -INFINITY;  // fully masked: zeros
    float sum[1] = {0.0f};
    for_each_chunk<kFwdChunks>(lane, a.tpr, a.sk, [&](int k, int64_t c) {
      float t[4];
      if (k < 0) scores(c, t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = empty ? 0.0f : expf((k >= 0 ? v[k][e] : t[e]) - m);
        if (k >= 0) v[k][e] = x;
        sum[0] += x;
      }
    });
    team_sum(sum, a.tpr, scratch);
    // sum >= 1 unless the row is fully masked (the max contributes exp(0)); a NaN score
    // makes it NaN, and so the whole row, as on the CPU.
    const float inv = empty ? 0.0f : 1.0f / sum[0];
    if (active) {
      for_each_chunk<kFwdChunks>(lane, a.tpr, a.sk, [&](int k, int64_t c) {
        float t[4];
        if (k < 0) scores(c, t);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          t[e] = (k >= 0 ? v[k][e] : (empty ? 0.0f : expf(t[e] - m))) * inv;
        store4(a.out, a.to, off + c, end, a.vec, t);
      });
    }
  }
}

__global__ void __launch_bounds__(kMaxTeam) softmax_bwd_kernel(SoftmaxArgs a) {
  __shared__ TeamScratch<1> scratch;
  const int team = threadIdx.x / a.tpr, lane = threadIdx.x % a.tpr;
  const int teams = blockDim.x / a.tpr;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * teams; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * teams) {
    const int64_t row = base + team;
    const bool active = row < a.rows;
    const int64_t off = (active ? row : 0) * a.sk, end = off + a.sk;
    float dp[kBwdChunks][4], p[kBwdChunks][4];
    auto chunk = [&](int64_t c, float d[4], float q[4]) {
#pragma unroll
      for (int e = 0; e < 4; ++e) d[e] = q[e] = 0.0f;
      if (active) {
        load4(a.in0, a.t0, off + c, end, a.vec, d);
        load4(a.in1, a.t1, off + c, end, a.vec, q);
      }
    };
    float dot[1] = {0.0f};
    for_each_chunk<kBwdChunks>(lane, a.tpr, a.sk, [&](int k, int64_t c) {
      float d[4], q[4];
      chunk(c, d, q);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (k >= 0) dp[k][e] = d[e], p[k][e] = q[e];
        dot[0] += d[e] * q[e];  // zeros past Sk
      }
    });
    team_sum(dot, a.tpr, scratch);
    if (active) {
      for_each_chunk<kBwdChunks>(lane, a.tpr, a.sk, [&](int k, int64_t c) {
        float d[4], q[4];
        if (k < 0) chunk(c, d, q);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pe = k >= 0 ? p[k][e] : q[e], de = k >= 0 ? dp[k][e] : d[e];
          d[e] = a.scale * pe * (de - dot[0]);
        }
        store4(a.out, a.to, off + c, end, a.vec, d);
      });
    }
  }
}

void launch_softmax(const OpCall* call, const op_checks::SoftmaxShape& s, bool bwd,
                    const char* op) {
  const int64_t rows = s.b * s.h * s.t;
  if (rows == 0 || s.sk == 0) return;
  const TensorView &in0 = call->inputs[0], &in1 = call->inputs[1], &out = call->outputs[0];
  SoftmaxArgs a{};
  a.in0 = in0.data, a.t0 = in0.dtype;
  a.in1 = bwd ? in1.data : nullptr, a.t1 = bwd ? in1.dtype : DType::kF32;
  a.seg = bwd ? nullptr : static_cast<const int32_t*>(in1.data);  // may be null
  a.out = out.data, a.to = out.dtype;
  a.rows = rows, a.h = s.h, a.t = s.t, a.sk = s.sk;
  a.scale = s.attrs.scale;
  a.causal = s.attrs.causal != 0;
  a.vec = s.sk % 4 == 0 && aligned4(in0) && aligned4(out) && (!bwd || aligned4(in1));
  RowGeometry g = row_geometry(rows, s.sk, bwd ? kBwdChunks : kFwdChunks, kMaxGridBlocks);
  a.tpr = g.tpr;
  if (bwd)
    softmax_bwd_kernel<<<g.grid, g.block, 0, stream_of(call)>>>(a);
  else
    softmax_fwd_kernel<<<g.grid, g.block, 0, stream_of(call)>>>(a);
  launch_check(op);
}

op_checks::SoftmaxShape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_softmax_fwd(c, s, d);
}
op_checks::SoftmaxShape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_softmax_bwd(c, s, d);
}

Status masked_softmax_fwd(const OpCall* call) {
  return guard([&] {
    launch_softmax(call, check_fwd(call, false, DeviceType::kCuda), false, ops::kMaskedSoftmaxFwd);
  });
}

Status masked_softmax_bwd(const OpCall* call) {
  return guard([&] {
    launch_softmax(call, check_bwd(call, false, DeviceType::kCuda), true, ops::kMaskedSoftmaxBwd);
  });
}

LOOM_CUDA_HOOKS(masked_softmax_fwd, check_fwd, 5)
LOOM_CUDA_HOOKS(masked_softmax_bwd, check_bwd, 4)

}  // namespace

void add_softmax_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kMaskedSoftmaxFwd, masked_softmax_fwd, masked_softmax_fwd_supports,
                   masked_softmax_fwd_cost);
  add_cuda_kernels(out, ops::kMaskedSoftmaxBwd, masked_softmax_bwd, masked_softmax_bwd_supports,
                   masked_softmax_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise
