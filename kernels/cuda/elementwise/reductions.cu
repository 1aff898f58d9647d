// sumsq, sumsq_multi and amax (loom/ops.h, "Elementwise") on CUDA: whole-tensor reductions
// into a scalar that the call accumulates into (out[0] += sum X^2 in f64, over one tensor or
// K; out[0] = max(out[0], max |X|)). sumsq_multi launches once per table of up to 512
// tensors (the gradient norm of a model in a launch or two, not one per parameter).
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

// ---- sumsq_multi: one launch per table of up to kSumSqMultiMax tensors ----------------

inline constexpr int kSumSqMultiMax = 512;
// Elements per block: 16 packs of 4 per thread of a 256-thread block; a multiple of 4, so
// an aligned tensor stays aligned for packs in every chunk.
inline constexpr int64_t kSumSqMultiChunk = 16384;

struct SumSqMultiTable {
  int32_t count;
  // block_start[i]: tensor i's first block; block_start[count]: the launch's blocks (an
  // empty tensor has none).
  int32_t block_start[kSumSqMultiMax + 1];
  const void* x[kSumSqMultiMax];
  int64_t n[kSumSqMultiMax];
  uint8_t vec[kSumSqMultiMax];  // 1: aligned for packs of 4
};
static_assert(sizeof(SumSqMultiTable) <= 32764,
              "sumsq_multi's table exceeds the 32764 bytes of kernel parameters");

// One block per chunk of one tensor: f64 partial sums, the block's total into out[0] with
// one atomic (as sumsq: the order of the blocks' adds may vary in the last bits).
// __grid_constant__: the table is read in place from the parameter space.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sumsq_multi_kernel(const __grid_constant__ SumSqMultiTable t, double* __restrict__ out) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  int lo = 0, hi = t.count - 1;  // the tensor holding block b: the last start <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.block_start[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const T* x = static_cast<const T*>(t.x[lo]);
  const int64_t begin = int64_t{b - t.block_start[lo]} * kSumSqMultiChunk;
  const int64_t end = begin + kSumSqMultiChunk < t.n[lo] ? begin + kSumSqMultiChunk : t.n[lo];
  double acc = 0.0;
  int64_t done = begin;
  if (t.vec[lo]) {
    for (int64_t p = begin / 4 + threadIdx.x; p < end / 4; p += blockDim.x) {
      float v[4];
      load_pack<T, 4>(x + p * 4, v);
#pragma unroll
      for (int k = 0; k < 4; ++k) acc += static_cast<double>(v[k]) * v[k];
    }
    done = end / 4 * 4;
  }
  for (int64_t i = done + threadIdx.x; i < end; i += blockDim.x) {
    const double v = to_f32<T>(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

void launch_sumsq_multi(const SumSqMultiTable& t, DType dt, double* out, cudaStream_t stream) {
  const int32_t blocks = t.block_start[t.count];
  if (blocks == 0) return;  // every tensor empty
  LOOM_CUDA_FLOAT_SWITCH(dt, T, ops::kSumSqMulti, {
    sumsq_multi_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, out);
  });
  launch_check(ops::kSumSqMulti);
}

Status sumsq_multi(const OpCall* call) {
  return guard([&] {
    op_checks::check_sumsq_multi(call, false, DeviceType::kCuda);
    const TensorView& X0 = call->inputs[0];
    current_device(ops::kSumSqMulti, X0);
    for (int32_t i = 1; i < call->num_inputs; ++i)
      if (call->inputs[i].device.index != X0.device.index)
        throw Error(Code::kInvalidArgument,
                    std::string(ops::kSumSqMulti) + ": X[" + std::to_string(i) +
                        "] is on cuda:" + std::to_string(call->inputs[i].device.index) +
                        " but X[0] on cuda:" + std::to_string(X0.device.index) +
                        ": one call reads one device");
    double* out = static_cast<double*>(call->outputs[0].data);
    const cudaStream_t stream = stream_of(call);
    const uintptr_t align = X0.dtype == DType::kF32 ? 16 : 8;
    SumSqMultiTable t;  // ~11 KB: copied into each launch's parameters
    t.count = 0;
    t.block_start[0] = 0;
    for (int32_t i = 0; i < call->num_inputs; ++i) {
      const int64_t n = numel(call->inputs[i]);
      const int64_t blocks = (n + kSumSqMultiChunk - 1) / kSumSqMultiChunk;
      const int64_t start = t.block_start[t.count];
      if (t.count > 0 && (t.count == kSumSqMultiMax || start + blocks > INT32_MAX)) {
        launch_sumsq_multi(t, X0.dtype, out, stream);
        t.count = 0;
      }
      t.x[t.count] = call->inputs[i].data;
      t.n[t.count] = n;
      t.vec[t.count] = is_aligned(call->inputs[i].data, align) ? 1 : 0;
      t.block_start[t.count + 1] = static_cast<int32_t>(t.block_start[t.count] + blocks);
      ++t.count;
    }
    launch_sumsq_multi(t, X0.dtype, out, stream);
  });
}

// 2 flops per element of every tensor, and the bytes of every tensor.
Status sumsq_multi_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    const int64_t n = op_checks::check_sumsq_multi(call, true, DeviceType::kCuda);
    *out = io_cost(call, 2.0 * static_cast<double>(n));
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
  add_cuda_kernels(out, ops::kSumSqMulti, sumsq_multi, supports<op_checks::check_sumsq_multi>,
                   sumsq_multi_cost);
  add_cuda_kernels(out, ops::kAmax, amax, supports<check_amax>, cost<check_amax, 1>);
}

}  // namespace loom::kernels::cuda::elementwise
