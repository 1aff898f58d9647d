// bias_add and bias_grad (loom/ops.h, "Elementwise") on CUDA, over Y / dY (N, C).
//
// Geometry: threads run along C (coalesced), on packs of 4 columns when C % 4 == 0 and
// the pointers are aligned (every row then starts aligned too), else on single columns;
// grid.x covers C, grid.y a set of row slices, each block striding over rows n = blockIdx.y,
// blockIdx.y + gridDim.y, ... So a thread keeps its bias values (bias_add) or its column
// sums (bias_grad) in registers across rows and no index is ever divided by C. About 1024
// blocks in all: enough to fill an H100, few enough partial sums.
// bias_grad is deterministic: each (row slice, column) sum is accumulated in f64 by one
// thread, written to the stream's scratch (common/resources.cuh), and a second kernel adds the
// slices in a fixed order (32 interleaved runs, then their sums) and accumulates
// dbias[c] += float(sum), as the CPU reference does. With a single slice (or partials too large for
// the scratch) the first kernel adds into dbias directly.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/elementwise.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/elementwise/registry.cuh"

namespace loom::kernels::cuda::elementwise {
namespace {

constexpr int64_t kTargetBlocks = 1024;

struct Geometry {
  dim3 grid;
  bool vec;
};

// grid.x over C / 4 packs (or C columns), grid.y over row slices.
Geometry geometry(int64_t N, int64_t C, bool aligned, int64_t max_slices) {
  Geometry g{};
  g.vec = aligned && C % 4 == 0;
  const int64_t cols = g.vec ? C / 4 : C;
  const unsigned gx = grid_for(cols, kThreads, int64_t{1} << 30);
  int64_t slices = kTargetBlocks / gx;
  if (slices > N) slices = N;
  if (slices > max_slices) slices = max_slices;
  if (slices > 65535) slices = 65535;
  if (slices < 1) slices = 1;
  g.grid = dim3(gx, static_cast<unsigned>(slices), 1);
  return g;
}

template <class TB, class TY, bool kVec>
__global__ void bias_add_kernel(const TB* __restrict__ bias, TY* __restrict__ y, int64_t N,
                                int64_t C) {
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;  // pack or column
  if (kVec) {
    if (c >= C / 4) return;
    float b[4];
    load_pack<TB, 4>(bias + c * 4, b);
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
      TY* p = y + n * C + c * 4;
      float v[4];
      load_pack<TY, 4>(p, v);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] += b[k];
      store_pack<TY, 4>(p, v);
    }
  } else {
    if (c >= C) return;
    const float b = to_f32<TB>(bias[c]);
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
      TY* p = y + n * C + c;
      *p = from_f32<TY>(to_f32<TY>(*p) + b);
    }
  }
}

// Column sums of this block's row slice: into partial[blockIdx.y][c] (f64), or, when
// `partial` is null (one slice), straight into dbias[c] += float(sum).
template <class T, bool kVec>
__global__ void bias_grad_kernel(const T* __restrict__ dy, int64_t N, int64_t C,
                                 double* __restrict__ partial, float* __restrict__ dbias) {
  constexpr int W = kVec ? 4 : 1;
  const int64_t c = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * W;  // first column
  if (c >= C) return;
  double acc[W] = {};
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float v[W];
    if (kVec)
      load_pack<T, W>(dy + n * C + c, v);
    else
      v[0] = to_f32<T>(dy[n * C + c]);
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] += v[k];
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if (partial != nullptr)
      partial[int64_t{blockIdx.y} * C + c + k] = acc[k];
    else
      dbias[c + k] += static_cast<float>(acc[k]);
  }
}

// Adds the row slices' partial sums of each column in a fixed order and accumulates dbias.
// A block takes 32 columns with 32 threads on each: thread (x, y) sums slices y, y + 32, ...
// in order (coalesced along the columns), then thread (x, 0) adds the 32 sums in order of y.
// (One thread per column summing up to ~1000 slices alone took 50 us a call on an H200.)
constexpr int kFinishCols = 32, kFinishRows = 32;
__global__ void __launch_bounds__(kFinishCols* kFinishRows)
    bias_grad_finish_kernel(const double* __restrict__ partial, int64_t slices, int64_t C,
                            float* __restrict__ dbias) {
  __shared__ double sums[kFinishRows][kFinishCols + 1];
  const int x = threadIdx.x % kFinishCols, y = threadIdx.x / kFinishCols;
  const int64_t c = int64_t{blockIdx.x} * kFinishCols + x;
  double s = 0.0;
  if (c < C)
    for (int64_t r = y; r < slices; r += kFinishRows) s += partial[r * C + c];
  sums[y][x] = s;
  __syncthreads();
  if (y == 0 && c < C) {
    double t = 0.0;
    for (int k = 0; k < kFinishRows; ++k) t += sums[k][x];
    dbias[c] += static_cast<float>(t);
  }
}

Status bias_add(const OpCall* call) {
  return guard([&] {
    op_checks::check_bias_add(call, false, DeviceType::kCuda);
    const TensorView &bias = call->inputs[0], &Y = call->outputs[0];
    current_device(ops::kBiasAdd, Y);
    const int64_t C = last_dim(Y), N = rows_of(Y);
    if (N == 0 || C == 0) return;
    cudaStream_t stream = stream_of(call);
    LOOM_CUDA_FLOAT_SWITCH(bias.dtype, Tb, ops::kBiasAdd, {
      LOOM_CUDA_FLOAT_SWITCH(Y.dtype, Ty, ops::kBiasAdd, {
        const Geometry g = geometry(N, C,
                                    is_aligned(bias.data, pack_alignment<Tb, 4>()) &&
                                        is_aligned(Y.data, pack_alignment<Ty, 4>()),
                                    N);
        const auto* b = static_cast<const Tb*>(bias.data);
        auto* y = static_cast<Ty*>(Y.data);
        if (g.vec)
          bias_add_kernel<Tb, Ty, true><<<g.grid, kThreads, 0, stream>>>(b, y, N, C);
        else
          bias_add_kernel<Tb, Ty, false><<<g.grid, kThreads, 0, stream>>>(b, y, N, C);
      });
    });
    launch_check(ops::kBiasAdd);
  });
}

Status bias_grad(const OpCall* call) {
  return guard([&] {
    op_checks::check_bias_grad(call, false, DeviceType::kCuda);
    const TensorView &dY = call->inputs[0], &db = call->outputs[0];
    int device = current_device(ops::kBiasGrad, dY);
    const int64_t C = last_dim(dY), N = rows_of(dY);
    if (N == 0 || C == 0) return;  // dbias += 0
    cudaStream_t stream = stream_of(call);
    float* dbias = static_cast<float*>(db.data);
    const int64_t max_slices = static_cast<int64_t>(kScratchBytes / sizeof(double)) / C;
    LOOM_CUDA_FLOAT_SWITCH(dY.dtype, T, ops::kBiasGrad, {
      const Geometry g = geometry(N, C, is_aligned(dY.data, pack_alignment<T, 4>()),
                                  max_slices > 0 ? max_slices : 1);
      double* partial =
          g.grid.y > 1 ? static_cast<double*>(stream_scratch(device, stream).data) : nullptr;
      const auto* dy = static_cast<const T*>(dY.data);
      if (g.vec)
        bias_grad_kernel<T, true><<<g.grid, kThreads, 0, stream>>>(dy, N, C, partial, dbias);
      else
        bias_grad_kernel<T, false><<<g.grid, kThreads, 0, stream>>>(dy, N, C, partial, dbias);
      launch_check(ops::kBiasGrad);
      if (partial != nullptr) {
        bias_grad_finish_kernel<<<static_cast<unsigned>((C + kFinishCols - 1) / kFinishCols),
                                  kFinishCols * kFinishRows, 0, stream>>>(partial, g.grid.y, C,
                                                                          dbias);
        launch_check(ops::kBiasGrad);
      }
    });
  });
}

}  // namespace

void add_bias_kernels(std::vector<KernelDesc>& out) {
  using op_checks::check_bias_add;
  using op_checks::check_bias_grad;
  // bias_add is keyed on Y's dtype, bias_grad on dY's; one add per element.
  add_cuda_kernels(out, ops::kBiasAdd, bias_add, supports<check_bias_add>, cost<check_bias_add, 1>);
  add_cuda_kernels(out, ops::kBiasGrad, bias_grad, supports<check_bias_grad>,
                   cost<check_bias_grad, 1>);
}

}  // namespace loom::kernels::cuda::elementwise
