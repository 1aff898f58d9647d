// rope_fwd / rope_bwd (loom/ops.h): rotary position embedding, GPT-NeoX / Llama layout.
// X and Y (B, T, H, D) may have strided rows (q and k as views of a fused QKV projection,
// turned in place: op_checks::RopeShape::x / y). In each head channel i < half =
// rotary_dim / 2 pairs with i + half and the pair turns by the angle position * inv_freq[i]
// (backward: by minus that angle, a rotation's gradient being its transpose); channels from
// rotary_dim on pass through.
//
// Algorithm (rope_kernel.cuh has the kernels): the angle in f64, as the reference forms
// it, and the rotation in f32. When X and Y share a dtype (the typed kernel), the angle is
// reduced to [-pi, pi] in f64 and its cosine and sine taken by sincosf of the reduced
// angle rounded to f32: within 2^-22 ~ 2.4e-7 of cos and sin of the f64 angle at any
// position, where an unreduced f32 angle would be off by up to position * 2^-24 radians
// (5e-4 at position 8192), far past the f32 tolerance. With a dtype mix (the general
// kernel), cosine and sine in f64, rounded to f32.
//
// Launch: typed, one thread per (token, 4 heads, 8 bf16 / f16 or 4 f32 pair indices: one
// 16-byte access per half when half and D are multiples of that and the tensors are 16-byte
// aligned with every row, else 1 pair index), its cosines and sines computed once for its 4
// heads. General: the grid strides over the B * T tokens, one token per block at a time; a
// block's 256 threads are (32..256 pair lanes i) x (256 / lanes head rows), so consecutive
// threads read consecutive channels of a head. Each thread reads both channels of its pairs
// before writing them, and a passed-through channel is read and written by one thread, so Y
// may alias X.
//
// Why the typed kernel: the general one took 5.2 ms of an H200 LLaMA 1.3B training step
// (2026-11-27 profile), with an f64 sincos per (token, pair index, head row) and a dtype
// switch per element.
#include <loom/cpp/op_checks/rope.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/rope_kernel.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

RopeStrides strides_of(const op_checks::RopeShape& s) {
  return {s.x.b_, s.x.t_, s.x.h_, s.y.b_, s.y.t_, s.y.h_};
}

template <class T>
void launch_typed(const RopePlan& p, const TensorView& X, const int32_t* positions,
                  const float* inv_freq, const TensorView& Y, const op_checks::RopeShape& s,
                  bool bwd, cudaStream_t stream) {
  const RopeTypedArgs<T> a = rope_typed_args<T>(p, X.data, positions, inv_freq, Y.data, s.t, s.h,
                                                s.d, s.half, bwd, strides_of(s));
  const unsigned blocks = rope_typed_blocks(p);
  if (p.width == 1)
    rope_typed_kernel<T, 1><<<blocks, kFlatThreads, 0, stream>>>(a);
  else
    rope_typed_kernel<T, kRopeWidth<T>><<<blocks, kFlatThreads, 0, stream>>>(a);
}

void launch_rope(const OpCall* call, const op_checks::RopeShape& s, bool bwd, const char* op) {
  const int64_t tokens = s.b * s.t;
  if (tokens == 0 || s.h == 0 || s.d == 0) return;
  const TensorView &X = call->inputs[0], &Y = call->outputs[0];
  const int32_t* positions = static_cast<const int32_t*>(call->inputs[1].data);  // may be null
  const float* inv_freq = static_cast<const float*>(call->inputs[2].data);
  const RopePlan p =
      rope_plan(X.data, X.dtype, Y.data, Y.dtype, tokens, s.t, s.h, s.d, s.half, strides_of(s));
  if (p.typed) {
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, op, {
      launch_typed<T>(p, X, positions, inv_freq, Y, s, bwd, stream_of(call));
    });
  } else {
    unsigned grid = static_cast<unsigned>(std::min<int64_t>(tokens, kMaxGridBlocks));
    rope_kernel<<<grid, kFlatThreads, 0, stream_of(call)>>>(
        X.data, X.dtype, positions, inv_freq, Y.data, Y.dtype, tokens, s.t, s.h, s.d, s.half,
        bwd ? -1.0 : 1.0, p.lanes, strides_of(s));
  }
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
