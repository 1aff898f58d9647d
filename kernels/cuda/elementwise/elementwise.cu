// add, cast and scale (loom/ops.h, "Elementwise") on CUDA: pure maps over any float dtypes.
//
// Bandwidth-bound: grid-stride over packs of 4 elements (16-byte f32 / 8-byte 16-bit
// accesses) when every pointer is aligned for them, else over single elements (still
// coalesced); at most 4096 blocks of 256 threads, 64-bit indices. Y may alias an input
// (add, scale): each element is read and written by the same thread, in that order, so
// no pointer is __restrict__. A cast between equal dtypes is a device-to-device copy.
// f64 (loom/ops/elementwise.h; the fp64 router): add with A, B and Y all f64 adds in f64; a
// cast with f64 on either side converts through f64 (exact to f64; from f64 rounded to f32,
// then to bf16 / f16, as the CPU's cast), one element per thread and step. Both are also
// registered under the f64 key.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/elementwise.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/elementwise/registry.cuh"

namespace loom::kernels::cuda::elementwise {
namespace {

// y[i] = f(a[i], b[i]) over n elements, packs of 4 when kVec. B = A for unary maps (b unused).
template <class TA, class TB, class TY, bool kVec, class F>
__device__ __forceinline__ void map2(const TA* a, const TB* b, TY* y, int64_t n, F f) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (kVec) {
    const int64_t packs = n / 4;
    for (int64_t p = first; p < packs; p += stride) {
      float av[4], bv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      load_pack<TA, 4>(a + p * 4, av);
      if (b != nullptr) load_pack<TB, 4>(b + p * 4, bv);
#pragma unroll
      for (int k = 0; k < 4; ++k) av[k] = f(av[k], bv[k]);
      store_pack<TY, 4>(y + p * 4, av);
    }
    done = packs * 4;
  }
  for (int64_t i = done + first; i < n; i += stride)
    y[i] = from_f32<TY>(f(to_f32<TA>(a[i]), b != nullptr ? to_f32<TB>(b[i]) : 0.0f));
}

template <class TA, class TB, class TY, bool kVec>
__global__ void add_kernel(const TA* a, const TB* b, TY* y, int64_t n) {
  map2<TA, TB, TY, kVec>(a, b, y, n, [](float x, float z) { return x + z; });
}

template <class TX, class TY, bool kVec>
__global__ void cast_kernel(const TX* x, TY* y, int64_t n) {
  map2<TX, TX, TY, kVec>(x, static_cast<const TX*>(nullptr), y, n,
                         [](float v, float) { return v; });
}

template <class TX, class TY, bool kVec>
__global__ void scale_kernel(const TX* x, TY* y, int64_t n, float alpha) {
  map2<TX, TX, TY, kVec>(x, static_cast<const TX*>(nullptr), y, n,
                         [alpha](float v, float) { return alpha * v; });
}

__global__ void add_f64_kernel(const double* a, const double* b, double* y, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = a[i] + b[i];
}

template <class TX, class TY>
__global__ void cast_f64_kernel(const TX* x, TY* y, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f64<TY>(to_f64<TX>(x[i]));
}

Status add(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_add(call, false, DeviceType::kCuda);
    const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
    current_device(ops::kAdd, Y);
    if (n == 0) return;
    cudaStream_t stream = stream_of(call);
    if (A.dtype == DType::kF64) {  // the checks admit f64 only for A, B and Y together
      add_f64_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const double*>(A.data), static_cast<const double*>(B.data),
          static_cast<double*>(Y.data), n);
      launch_check(ops::kAdd);
      return;
    }
    LOOM_CUDA_FLOAT_SWITCH(A.dtype, Ta, ops::kAdd, {
      LOOM_CUDA_FLOAT_SWITCH(B.dtype, Tb, ops::kAdd, {
        LOOM_CUDA_FLOAT_SWITCH(Y.dtype, Ty, ops::kAdd, {
          const bool vec = is_aligned(A.data, pack_alignment<Ta, 4>()) &&
                           is_aligned(B.data, pack_alignment<Tb, 4>()) &&
                           is_aligned(Y.data, pack_alignment<Ty, 4>());
          const auto* a = static_cast<const Ta*>(A.data);
          const auto* b = static_cast<const Tb*>(B.data);
          auto* y = static_cast<Ty*>(Y.data);
          if (vec)
            add_kernel<Ta, Tb, Ty, true>
                <<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(a, b, y, n);
          else
            add_kernel<Ta, Tb, Ty, false>
                <<<grid_for(n, kThreads), kThreads, 0, stream>>>(a, b, y, n);
        });
      });
    });
    launch_check(ops::kAdd);
  });
}

Status cast(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_cast(call, false, DeviceType::kCuda);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    current_device(ops::kCast, Y);
    if (n == 0) return;
    cudaStream_t stream = stream_of(call);
    if (X.dtype == Y.dtype) {
      if (X.data != Y.data)
        cuda_check(cudaMemcpyAsync(Y.data, X.data, static_cast<size_t>(n) * dtype_size(X.dtype),
                                   cudaMemcpyDeviceToDevice, stream),
                   "cast: cudaMemcpyAsync");
      return;
    }
    if (X.dtype == DType::kF64 || Y.dtype == DType::kF64) {
      LOOM_CUDA_FLOAT_OR_F64_SWITCH(X.dtype, Tx, ops::kCast, {
        LOOM_CUDA_FLOAT_OR_F64_SWITCH(Y.dtype, Ty, ops::kCast, {
          cast_f64_kernel<Tx, Ty><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
              static_cast<const Tx*>(X.data), static_cast<Ty*>(Y.data), n);
        });
      });
      launch_check(ops::kCast);
      return;
    }
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, Tx, ops::kCast, {
      LOOM_CUDA_FLOAT_SWITCH(Y.dtype, Ty, ops::kCast, {
        const bool vec = is_aligned(X.data, pack_alignment<Tx, 4>()) &&
                         is_aligned(Y.data, pack_alignment<Ty, 4>());
        const auto* x = static_cast<const Tx*>(X.data);
        auto* y = static_cast<Ty*>(Y.data);
        if (vec)
          cast_kernel<Tx, Ty, true>
              <<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(x, y, n);
        else
          cast_kernel<Tx, Ty, false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
      });
    });
    launch_check(ops::kCast);
  });
}

Status scale(const OpCall* call) {
  return guard([&] {
    const int64_t n = op_checks::check_scale(call, false, DeviceType::kCuda);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    current_device(ops::kScale, Y);
    if (n == 0) return;
    const float alpha = static_cast<const ops::ScaleAttrs*>(call->attrs)->alpha;
    cudaStream_t stream = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, Tx, ops::kScale, {
      LOOM_CUDA_FLOAT_SWITCH(Y.dtype, Ty, ops::kScale, {
        const bool vec = is_aligned(X.data, pack_alignment<Tx, 4>()) &&
                         is_aligned(Y.data, pack_alignment<Ty, 4>());
        const auto* x = static_cast<const Tx*>(X.data);
        auto* y = static_cast<Ty*>(Y.data);
        if (vec)
          scale_kernel<Tx, Ty, true>
              <<<grid_for(n / 4 + 1, kThreads), kThreads, 0, stream>>>(x, y, n, alpha);
        else
          scale_kernel<Tx, Ty, false>
              <<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n, alpha);
      });
    });
    launch_check(ops::kScale);
  });
}

}  // namespace

void add_map_kernels(std::vector<KernelDesc>& out) {
  using namespace op_checks;
  add_cuda_kernels(out, ops::kAdd, add, supports<check_add>, cost<check_add, 1>);
  add_cuda_kernels(out, ops::kCast, cast, supports<check_cast>, cost<check_cast, 0>);
  add_cuda_kernels(out, ops::kAdd, add, supports<check_add>, cost<check_add, 1>, {DType::kF64});
  add_cuda_kernels(out, ops::kCast, cast, supports<check_cast>, cost<check_cast, 0>, {DType::kF64});
  add_cuda_kernels(out, ops::kScale, scale, supports<check_scale>, cost<check_scale, 1>);
}

}  // namespace loom::kernels::cuda::elementwise
