// rope_fwd / rope_bwd (loom/ops.h): rotary position embedding, GPT-NeoX / Llama layout.
// In each head of X (B, T, H, D), channel i < half = rotary_dim / 2 pairs with i + half and
// the pair turns by the angle position * inv_freq[i] (backward: by minus that angle, a
// rotation's gradient being its transpose); channels from rotary_dim on pass through.
//
// Algorithm: the angle and its cosine and sine in f64, as the reference computes them: an
// f32 angle would be off by up to position * 2^-24 radians (5e-4 at position 8192), far
// past the f32 tolerance; Hopper's f64 units make this cheap, and each (token, i) sine is
// reused by the heads of the token. The rotation itself is f32.
//
// Launch: the grid strides over the B * T tokens, one token per block at a time; a block of
// 256 threads is (x: 32..256 pair indices i, y: 256 / x heads), so consecutive threads read
// consecutive channels of a head. Each thread reads both channels of its pair before
// writing them, and a passed-through channel is read and written by one thread, so Y may
// alias X.
#include <loom/cpp/op_checks/rope.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

__global__ void rope_kernel(const void* x, DType xt, const int32_t* positions,
                            const float* inv_freq, void* y, DType yt, int64_t tokens, int64_t t,
                            int64_t h, int64_t d, int64_t half, double sign) {
  const int64_t rest = d - 2 * half;  // passed-through channels per head
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
  for (int64_t token = blockIdx.x; token < tokens; token += gridDim.x) {
    const double pos = positions != nullptr ? static_cast<double>(positions[token])
                                            : static_cast<double>(token % t);
    const int64_t head0 = token * h * d;  // first element of the token's heads
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      double s, c;
      sincos(pos * static_cast<double>(inv_freq[i]), &s, &c);
      const float cs = static_cast<float>(c), sn = static_cast<float>(sign * s);
      for (int64_t k = threadIdx.y; k < h; k += blockDim.y) {
        const int64_t e1 = head0 + k * d + i, e2 = e1 + half;
        const float x1 = load_elem(x, xt, e1), x2 = load_elem(x, xt, e2);
        store_elem(y, yt, e1, x1 * cs - x2 * sn);
        store_elem(y, yt, e2, x2 * cs + x1 * sn);
      }
    }
    if (rest > 0)
      for (int64_t j = tid; j < h * rest; j += threads) {
        const int64_t e = head0 + (j / rest) * d + 2 * half + j % rest;
        store_elem(y, yt, e, load_elem(x, xt, e));
      }
  }
}

void launch_rope(const OpCall* call, const op_checks::RopeShape& s, bool bwd, const char* op) {
  const int64_t tokens = s.b * s.t;
  if (tokens == 0 || s.h == 0 || s.d == 0) return;
  const TensorView &X = call->inputs[0], &Y = call->outputs[0];
  const int32_t* positions = static_cast<const int32_t*>(call->inputs[1].data);  // may be null
  unsigned bx = 32;
  while (bx < 256 && bx < s.half) bx *= 2;
  dim3 block(bx, 256 / bx);
  unsigned grid = static_cast<unsigned>(std::min<int64_t>(tokens, kMaxGridBlocks));
  rope_kernel<<<grid, block, 0, stream_of(call)>>>(
      X.data, X.dtype, positions, static_cast<const float*>(call->inputs[2].data), Y.data, Y.dtype,
      tokens, s.t, s.h, s.d, s.half, bwd ? -1.0 : 1.0);
  launch_check(op);
}

op_checks::RopeShape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_rope_fwd(c, s, d);
}
op_checks::RopeShape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_rope_bwd(c, s, d);
}

Status rope_fwd(const OpCall* call) {
  return guard(
      [&] { launch_rope(call, check_fwd(call, false, DeviceType::kCuda), false, ops::kRopeFwd); });
}

Status rope_bwd(const OpCall* call) {
  return guard(
      [&] { launch_rope(call, check_bwd(call, false, DeviceType::kCuda), true, ops::kRopeBwd); });
}

LOOM_CUDA_HOOKS(rope_fwd, check_fwd, 3)
LOOM_CUDA_HOOKS(rope_bwd, check_bwd, 3)

}  // namespace

void add_rope_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kRopeFwd, rope_fwd, rope_fwd_supports, rope_fwd_cost);
  add_cuda_kernels(out, ops::kRopeBwd, rope_bwd, rope_bwd_supports, rope_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise
