// rope_fp8_bwd (loom/ops/fp8.h): the QKV projection's output gradient turned back by rope (its
// query and key heads) and quantised into FP8 as fp8_quantize would quantise it, with its
// transpose and amax, without the rotated tensor in between: the bits of rope_bwd (its typed
// kernel) into dX's dtype followed by fp8_quantize, on these kernels.
//
// Algorithm (rope_fp8_kernel.cuh): fp8_quantize's typed tile loop over chunks of dX, each chunk
// of a query or key head's rotary channels loaded with its pair partners and rotated with
// rope_typed_kernel's expressions, its cos and sin from a table of the tile's 64 rows in dynamic
// shared memory (rope_fp8_table_bytes: 32 KiB at rotary_dim 128), filled once a band of rows by
// the same rope_cos_sin. Element by element where chunks would straddle a head or a half, or
// are not aligned (rope_fp8_plan). rotary_dim past 2 kRopeFp8MaxHalf = 256 fails, naming the
// pin that runs rope_bwd then fp8_quantize instead.
//
// Registers (ptxas, CUDA 13.0.88, sm_90a; rope_fp8_blocks_per_sm blocks of 256 threads a
// multiprocessor): bf16 and f16 at 4 blocks, 64 registers; f32 at 3, 80; no spills in any
// variant. The table's fill (RopeQkvSource::band) is a call, not inlined: inlined, its f64 and
// sincosf registers took every variant to 80 at 3 blocks, and to 12-84 bytes of spills at 4. A
// 104-byte stack frame: the source's fields, stored once at the start for the call to read
// (the tile loop keeps them in registers: no local loads there, cuobjdump -sass), and
// sincosf's slow path (never taken: the argument is reduced to [-pi, pi] first). 4480 bytes of
// static shared memory (the transposed tile) beside the table.
#include <loom/cpp/op_checks/fp8.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/rope_fp8_kernel.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

template <class T, bool kE5M2>
void launch_typed(const RopeFp8Plan& p, const RopeFp8Args<T>& a, cudaStream_t stream) {
  auto go = [&](auto kernel) {
    allow_dynamic_smem(kernel, p.smem, ops::kRopeFp8Bwd);
    kernel<<<p.blocks, kFp8TileThreads, p.smem, stream>>>(a);
  };
  if (p.vec)
    go(rope_fp8_kernel<T, true, kE5M2>);
  else
    go(rope_fp8_kernel<T, false, kE5M2>);
}

op_checks::RopeFp8Shape check(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_rope_fp8_bwd(c, s, d);
}

void launch(const OpCall* call, const op_checks::RopeFp8Shape& s) {
  const char* op = ops::kRopeFp8Bwd;
  const TensorView& X = call->inputs[0];
  const float* scale = static_cast<const float*>(call->inputs[3].data);
  float* scale_inv = s.out.scale_inv ? static_cast<float*>(call->outputs[3].data) : nullptr;
  const int64_t m = s.out.m, k = s.out.k;
  if (m * k == 0) {  // nothing to quantise, amax[0] unchanged; scale_inv still written
    if (scale_inv != nullptr) launch_fp8_scale_inv(scale, scale_inv, stream_of(call), op);
    return;
  }
  // RopeQkvSource's columns, positions and head arithmetic are 32-bit.
  if (k >= (int64_t{1} << 31) || s.t >= (int64_t{1} << 31))
    fail(Code::kUnimplemented, std::string(op) + ": a row of " + std::to_string(k) +
                                   " columns or " + std::to_string(s.t) +
                                   " tokens a sequence is past this kernel's 2^31");
  if (s.half > kRopeFp8MaxHalf)
    fail(Code::kUnimplemented,
         std::string(op) + ": rotary_dim " + std::to_string(2 * s.half) +
             " is past this kernel's " + std::to_string(2 * kRopeFp8MaxHalf) +
             " (its table of cos and sin lives in shared memory): set kernels.pin " +
             "{\"rope_fp8_bwd\": \"none\"} in the spec to run rope_bwd then fp8_quantize");
  uint8_t* y = s.out.y ? static_cast<uint8_t*>(call->outputs[0].data) : nullptr;
  uint8_t* yt = s.out.yt ? static_cast<uint8_t*>(call->outputs[1].data) : nullptr;
  float* amax = s.out.amax ? static_cast<float*>(call->outputs[2].data) : nullptr;
  const RopeFp8Plan p =
      rope_fp8_plan(X.data, y, yt, X.dtype, m, k, s.d, s.half, multiprocessor_count(X.device.index),
                    shared_memory_per_multiprocessor(X.device.index));
  const bool e5m2 = s.out.out_dtype == DType::kF8E5M2;
  const cudaStream_t stream = stream_of(call);
  const TensorView& pos = call->inputs[1];
  LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, op, {
    const RopeFp8Args<T> a{static_cast<const T*>(X.data),
                           static_cast<const int32_t*>(pos.data),
                           static_cast<const float*>(call->inputs[2].data),
                           scale,
                           y,
                           yt,
                           amax,
                           scale_inv,
                           m,
                           k,
                           static_cast<uint32_t>(s.t),
                           static_cast<uint32_t>(s.heads * s.d),
                           static_cast<uint32_t>(s.d),
                           static_cast<uint32_t>(s.half),
                           static_cast<uint32_t>(s.heads - 1)};
    if (e5m2)
      launch_typed<T, true>(p, a, stream);
    else
      launch_typed<T, false>(p, a, stream);
  });
  launch_check(op);
}

Status rope_fp8_bwd(const OpCall* call) {
  return guard([&] { launch(call, check(call, false, DeviceType::kCuda)); });
}

// rope's 6 FLOPs a rotated pair (3 an element) plus the quantisation's 2.
LOOM_CUDA_HOOKS(rope_fp8_bwd, check, 5)

}  // namespace

void add_rope_fp8_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kRopeFp8Bwd, rope_fp8_bwd, rope_fp8_bwd_supports, rope_fp8_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise
