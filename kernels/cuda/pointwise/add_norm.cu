// add_layernorm_fwd / add_layernorm_bwd and add_rmsnorm_fwd / add_rmsnorm_bwd (loom/ops.h):
// the residual add fused into the norm after it.
//   fwd: Z = round(X + R) (X, R, Y, Z (N, C), one dtype); Y, mean, rstd = norm(Z), exactly
//        as layernorm_fwd / rmsnorm_fwd of the stored Z.
//   bwd: dX = norm_bwd(dY, Z, ...) + dZ (dY, Z, dZ, dX (N, C), one dtype); dweight +=,
//        dbias += as the plain backward of Z.
//
// The common transformer case (bf16, f16 or f32 throughout, C a multiple of 8 up to the
// warp-per-row kernels' widths, 16-byte aligned tensors, and for the backward the
// workspace) runs fused in norm_warp.cuh's kernels (kAdd): the forward reads X and R once,
// writes Z and Y in the same pass (no second read of Z); the backward adds dZ to dX in f32
// before the one rounding. Every other call (mixed dtypes, odd widths, wide rows, misaligned views,
// no workspace) runs the unfused sequence on the call's stream, as the CPU kernels do:
//   fwd: Z = X + R (residual_add_kernel below), then the plain forward of Z;
//   bwd: the plain backward of Z into dX, then dX = dX + dZ.
// Z may alias X or R: the add reads and writes each element in one thread, and the fused
// kernel reads a vector of X and R before it writes that vector of Z. dX aliases no input
// (the shared checks refuse dX == dZ).
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/norm.cuh"

namespace loom::kernels::cuda::pointwise {
namespace {

// y = a + b over n elements in f32, rounded once to y's dtype; chunks of 4 (one access each
// with `vec`), grid-stride. y may alias a or b (each element is read, then written, by one
// thread).
__global__ void residual_add_kernel(const void* a, DType at, const void* b, DType bt, void* y,
                                    DType yt, int64_t n, bool vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n;
       i += stride) {
    float va[4], vb[4];
    load4(a, at, i, n, vec, va);
    load4(b, bt, i, n, vec, vb);
#pragma unroll
    for (int e = 0; e < 4; ++e) va[e] += vb[e];
    store4(y, yt, i, n, vec, va);
  }
}

// Y = A + B for (N, C) views of n elements, on `stream`.
void launch_residual_add(const TensorView& A, const TensorView& B, const TensorView& Y, int64_t n,
                         cudaStream_t stream, const char* op) {
  const bool vec = aligned4(A) && aligned4(B) && aligned4(Y);
  residual_add_kernel<<<grid_for((n + 3) / 4, kFlatThreads), kFlatThreads, 0, stream>>>(
      A.data, A.dtype, B.data, B.dtype, Y.data, Y.dtype, n, vec);
  launch_check(op);
}

template <bool kRms>
op_checks::NormShape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_add_norm_fwd<kRms>(c, s, d);
}
template <bool kRms>
op_checks::NormShape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_add_norm_bwd<kRms>(c, s, d);
}

// inputs X, R, weight[, bias]; outputs Y, Z[, mean], rstd.
template <bool kRms>
void add_norm_fwd(const OpCall* call, const char* op) {
  const op_checks::NormShape s = check_fwd<kRms>(call, false, DeviceType::kCuda);
  if (s.n == 0) return;  // C == 0 still writes mean and rstd, as layernorm_fwd does
  const TensorView *in = call->inputs, *out = call->outputs;
  NormFwdTensors t{};
  t.x = &in[0];
  t.r = &in[1];
  t.w = &in[2];
  t.b = !kRms && in[3].data != nullptr ? &in[3] : nullptr;
  t.y = &out[0];
  t.z = &out[1];
  t.mean = kRms ? nullptr : static_cast<float*>(out[2].data);
  t.rstd = static_cast<float*>(out[kRms ? 2 : 3].data);
  const cudaStream_t stream = stream_of(call);
  if (s.c > 0 && try_norm_fwd_warp<kRms, true>(t, s, stream)) {
    launch_check(op);
    return;
  }
  if (s.c > 0) launch_residual_add(in[0], in[1], out[1], s.n * s.c, stream, op);
  t.x = &out[1];  // the plain forward of Z, by whichever kernel layernorm_fwd would take
  t.r = t.z = nullptr;
  if (s.c > 0 && try_norm_fwd_warp<kRms>(t, s, stream))
    launch_check(op);
  else
    launch_norm_fwd_general<kRms>(t, s, stream, op);
}

// inputs dY, Z, weight[, mean], rstd, dZ; outputs dX, dweight[, dbias].
template <bool kRms>
void add_norm_bwd(const OpCall* call, const char* op) {
  const op_checks::NormShape s = check_bwd<kRms>(call, false, DeviceType::kCuda);
  if (s.n == 0 || s.c == 0) return;
  NormBwdTensors t = norm_bwd_tensors<kRms>(call, s);  // dY, Z, weight, stats: the plain layout
  const TensorView& dZ = call->inputs[kRms ? 4 : 5];
  t.dz = &dZ;
  const cudaStream_t stream = stream_of(call);
  if (try_norm_bwd_warp<kRms, true>(t, s, stream, op)) return;
  t.dz = nullptr;
  if (!try_norm_bwd_warp<kRms>(t, s, stream, op)) launch_norm_bwd_general<kRms>(t, s, stream, op);
  launch_residual_add(*t.dx, dZ, *t.dx, s.n * s.c, stream, op);
}

template <bool kRms>
uint64_t add_norm_bwd_workspace(const OpCall* call) {
  uint64_t bytes = 0;
  check_passes([&] {
    op_checks::NormShape s = check_bwd<kRms>(call, true, DeviceType::kCuda);
    const int grads =
        !kRms && (call->outputs[2].ndim > 0 || call->outputs[2].data != nullptr) ? 2 : 1;
    bytes = norm_bwd_workspace_bytes(s.n, s.c, grads);
  });
  return bytes;
}

Status add_layernorm_fwd(const OpCall* c) {
  return guard([&] { add_norm_fwd<false>(c, ops::kAddLayerNormFwd); });
}
Status add_layernorm_bwd(const OpCall* c) {
  return guard([&] { add_norm_bwd<false>(c, ops::kAddLayerNormBwd); });
}
Status add_rmsnorm_fwd(const OpCall* c) {
  return guard([&] { add_norm_fwd<true>(c, ops::kAddRmsNormFwd); });
}
Status add_rmsnorm_bwd(const OpCall* c) {
  return guard([&] { add_norm_bwd<true>(c, ops::kAddRmsNormBwd); });
}

// The norms' flops per element plus one for the add (as the CPU kernels count them).
LOOM_CUDA_HOOKS(add_layernorm_fwd, check_fwd<false>, 9)
LOOM_CUDA_HOOKS(add_layernorm_bwd, check_bwd<false>, 15)
LOOM_CUDA_HOOKS(add_rmsnorm_fwd, check_fwd<true>, 5)
LOOM_CUDA_HOOKS(add_rmsnorm_bwd, check_bwd<true>, 9)

}  // namespace

void add_add_norm_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kAddLayerNormFwd, add_layernorm_fwd, add_layernorm_fwd_supports,
                   add_layernorm_fwd_cost);
  add_cuda_kernels(out, ops::kAddLayerNormBwd, add_layernorm_bwd, add_layernorm_bwd_supports,
                   add_layernorm_bwd_cost, {DType::kF32, DType::kBF16, DType::kF16}, kCudaName,
                   kCudaPriority, add_norm_bwd_workspace<false>);
  add_cuda_kernels(out, ops::kAddRmsNormFwd, add_rmsnorm_fwd, add_rmsnorm_fwd_supports,
                   add_rmsnorm_fwd_cost);
  add_cuda_kernels(out, ops::kAddRmsNormBwd, add_rmsnorm_bwd, add_rmsnorm_bwd_supports,
                   add_rmsnorm_bwd_cost, {DType::kF32, DType::kBF16, DType::kF16}, kCudaName,
                   kCudaPriority, add_norm_bwd_workspace<true>);
}

}  // namespace loom::kernels::cuda::pointwise
