// sumsq and amax (loom/ops.h, "Elementwise") on CUDA: whole-tensor reductions into a scalar
// that the call accumulates into (out[0] += sum X^2 in f64; out[0] = max(out[0], max |X|)).
//
// Geometry: grid-stride over packs of 4 elements (or single elements when X is not aligned
// for them), at most 1024 blocks of 256 threads (one full wave of an H100), so at most 1024
// atomics per call. Each thread accumulates in registers, the block reduces in shared
// memory, and thread 0 folds the block's result into out[0] with one atomic:
//   sumsq: f64 partial sums, atomicAdd on double (sm_60+). The order in which blocks add is
//          not fixed, so the last bits of the f64 sum may vary from run to run.
//   amax:  an unsigned max over the bits of |x| (a max that propagates NaN, exact and
//          order-free), folded into out[0] by an atomicCAS loop with a NaN-propagating
//          float max (kernels/cuda/common/amax.cuh, shared with fp8_quantize).
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/elementwise.h>

#include "kernels/cuda/common/amax.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/elementwise/registry.cuh"

namespace loom::kernels::cuda::elementwise {
namespace {

constexpr int64_t kMaxReduceBlocks = 1024;

template <class T, bool kVec>
__global__ void sumsq_kernel(const T* __restrict__ x, int64_t n, double* __restrict__ out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  double acc = 0.0;
  int64_t done = 0;
  if (kVec) {
    const int64_t packs = n / 4;
    for (int64_t p = first; p < packs; p += stride) {
      float v[4];
      load_pack<T, 4>(x + p * 4, v);
#pragma unroll
      for (int k = 0; k < 4; ++k) acc += static_cast<double>(v[k]) * v[k];
    }
    done = packs * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) {
    const double v = to_f32<T>(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

template <class T, bool kVec>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint32_t bits = 0u;  // +0.0f
  int64_t done = 0;
  if (kVec) {
    const int64_t packs = n / 4;
    for (int64_t p = first; p < packs; p += stride) {
      float v[4];
      load_pack<T, 4>(x + p * 4, v);
#pragma unroll
      for (int k = 0; k < 4; ++k) bits = max(bits, abs_bits(v[k]));
    }
    done = packs * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) bits = max(bits, abs_bits(to_f32<T>(x[i])));
  block_amax_fold(bits, out);
}

// Launches KERNEL<T, true> when x is aligned for packs of 4, else KERNEL<T, false>.
template <class T, template <class, bool> class Launch, class... Args>
void launch_reduction(const void* x, int64_t n, cudaStream_t stream, Args... args) {
  const T* p = static_cast<const T*>(x);
  if (is_aligned(x, pack_alignment<T, 4>()))
    Launch<T, true>::run(grid_for(n / 4 + 1, kThreads, kMaxReduceBlocks), stream, p, n, args...);
  else
    Launch<T, false>::run(grid_for(n, kThreads, kMaxReduceBlocks), stream, p, n, args...);
}

template <class T, bool kVec>
struct SumSqLaunch {
  static void run(unsigned blocks, cudaStream_t s, const T* x, int64_t n, double* out) {
    sumsq_kernel<T, kVec><<<blocks, kThreads, 0, s>>>(x, n, out);
  }
};

template <class T, bool kVec>
struct AmaxLaunch {
  static void run(unsigned blocks, cudaStream_t s, const T* x, int64_t n, float* out) {
    amax_kernel<T, kVec><<<blocks, kThreads, 0, s>>>(x, n, out);
  }
};

Status sumsq(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_sumsq(call, false, DeviceType::kCuda);
    const TensorView& X = call->inputs[0];
    current_device(ops::kSumSq, X);
    if (n == 0) return;  // out += 0
    double* out = static_cast<double*>(call->outputs[0].data);
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, ops::kSumSq,
                           { launch_reduction<T, SumSqLaunch>(X.data, n, stream_of(call), out); });
    launch_check(ops::kSumSq);
  });
}

Status amax(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_amax(call, false, DeviceType::kCuda);
    const TensorView& X = call->inputs[0];
    current_device(ops::kAmax, X);
    if (n == 0) return;  // out[0] unchanged
    float* out = static_cast<float*>(call->outputs[0].data);
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, ops::kAmax,
                           { launch_reduction<T, AmaxLaunch>(X.data, n, stream_of(call), out); });
    launch_check(ops::kAmax);
  });
}

}  // namespace

void add_reduction_kernels(std::vector<KernelDesc>& out) {
  using op_checks::check_amax;
  using op_checks::check_sumsq;
  add_cuda_kernels(out, ops::kSumSq, sumsq, supports<check_sumsq>, cost<check_sumsq, 2>);
  add_cuda_kernels(out, ops::kAmax, amax, supports<check_amax>, cost<check_amax, 1>);
}

}  // namespace loom::kernels::cuda::elementwise
