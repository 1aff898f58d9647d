// cross_entropy_fwd / cross_entropy_bwd (loom/ops.h) on CUDA.
//
// Forward: one block per row (grid-stride beyond 2^20 rows) folds the row's V logits into
// an online (max, sum of exp) in one pass of 16-byte loads (cross_entropy.cuh); thread 0
// writes lse = max + log(sum) and loss = (max - logit[label]) + log(sum). Then one block of
// 1024 threads computes the masked mean in f64 on the device (launch_masked_mean): no host
// sync, and the mean stays where the backward reads it.
// Backward: dlogits[n, j] = w_n * (exp(logits[n, j] - lse[n]) - onehot), w_n = dmean *
// mask[n] / sum(mask): purely elementwise given lse, so one block per row streams the row
// once (16-byte packs when logits and dlogits rows share their alignment, else scalar
// coalesced accesses). dmean is read on the device. sum(mask) is needed by every row
// before any writes, so with a mask a one-block kernel first writes it (f64) into the
// stream's scratch (common/resources.cuh); without a mask it is N, known on the host. With
// CrossEntropyShardAttrs the onehot applies at column labels[n] - vocab_start when that is
// inside this shard, and labels are checked against the whole vocabulary. Padding columns
// (CeShape::valid, loom/ops/loss.h) are left out of the fold and get gradient 0.
//
// Labels outside the vocabulary with mask != 0 never index the logits; they are reported
// lazily as kOutOfRange (label_errors.cuh): the forward writes NaN for that row's loss,
// the backward leaves out its onehot term.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/cross_entropy.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/loss/cross_entropy.cuh"
#include "kernels/cuda/loss/label_errors.cuh"
#include "kernels/cuda/loss/registry.cuh"

namespace loom::kernels::cuda::loss {
namespace {

using op_checks::CeShape;

constexpr int kReduceThreads = 1024;  // the one-block reductions over N rows

template <class T>
__global__ void ce_fwd_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                              const float* __restrict__ mask, float* __restrict__ loss,
                              float* __restrict__ lse, int64_t N, int64_t V, int64_t valid,
                              LabelErrorSink sink) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;  // columns [valid, V) are padding
    const MaxSum ms = block_max_sum(row_max_sum(row, valid));
    if (threadIdx.x == 0) {
      const float log_sum = logf(ms.s);
      lse[n] = ms.m + log_sum;
      const int32_t label = labels[n];
      const float w = mask != nullptr ? mask[n] : 1.0f;
      if (label >= 0 && label < valid) {
        loss[n] = (ms.m - to_f32<T>(row[label])) + log_sum;
      } else if (w != 0.0f) {
        report_label_error(sink, LabelOp::kFwd, n, label, valid);
        loss[n] = NAN;
      } else {
        loss[n] = 0.0f;
      }
    }
  }
}

__global__ void masked_mean_kernel(const float* __restrict__ loss, const float* __restrict__ mask,
                                   int64_t N, float* __restrict__ mean) {
  double acc = 0.0, total = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const float w = mask != nullptr ? mask[i] : 1.0f;
    total += w;
    if (w != 0.0f) acc += static_cast<double>(w) * loss[i];
  }
  acc = block_sum(acc);
  total = block_sum(total);
  if (threadIdx.x == 0) mean[0] = total != 0.0 ? static_cast<float>(acc / total) : 0.0f;
}

__global__ void mask_total_kernel(const float* __restrict__ mask, int64_t N,
                                  double* __restrict__ total) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += mask[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) total[0] = acc;
}

// One row of the backward: y[j] = w * (exp(x[j] - lse) - (j == col)), or 0 when w == 0 or
// j >= valid (padding).
template <class T, class D>
__device__ void ce_bwd_row(const T* __restrict__ x, D* __restrict__ y, int64_t V, int64_t valid,
                           float w, float lse, int64_t col) {
  constexpr int W = 16 / sizeof(T) > 16 / sizeof(D) ? 16 / sizeof(T) : 16 / sizeof(D);
  auto grad = [&](int64_t j, float v) {
    if (w == 0.0f || j >= valid) return 0.0f;
    return w * (exp2f((v - lse) * kLog2e) - (j == col ? 1.0f : 0.0f));
  };
  int64_t head = head_to_16(x, sizeof(T));
  if (head != head_to_16(y, sizeof(D))) head = V;  // rows aligned differently: all scalar
  if (head > V) head = V;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x)
    y[j] = from_f32<D>(grad(j, to_f32<T>(x[j])));
  const int64_t packs = (V - head) / W;
#pragma unroll 2
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const int64_t j0 = head + p * W;
    float v[W];
    load_pack<T, W>(x + j0, v);
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = grad(j0 + i, v[i]);
    store_pack<D, W>(y + j0, v);
  }
  for (int64_t j = head + packs * W + threadIdx.x; j < V; j += blockDim.x)
    y[j] = from_f32<D>(grad(j, to_f32<T>(x[j])));
}

template <class T, class D>
__global__ void ce_bwd_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                              const float* __restrict__ mask, const float* __restrict__ lse,
                              const float* __restrict__ dmean, const double* mask_total_dev,
                              double mask_total_host, D* __restrict__ dlogits, int64_t N, int64_t V,
                              int64_t valid, int64_t start, int64_t vocab, LabelErrorSink sink) {
  // The same few scalars in every thread: broadcast loads, no barrier needed.
  const double total = mask_total_dev != nullptr ? *mask_total_dev : mask_total_host;
  const double dm = dmean[0];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float mk = mask != nullptr ? mask[n] : 1.0f;
    const float w = total != 0.0 ? static_cast<float>(dm * mk / total) : 0.0f;
    const int32_t label = labels[n];
    const int64_t col = label - start >= 0 && label - start < valid ? label - start : -1;
    if (threadIdx.x == 0 && mk != 0.0f && (label < 0 || label >= vocab))
      report_label_error(sink, LabelOp::kBwd, n, label, vocab);
    ce_bwd_row<T, D>(logits + n * V, dlogits + n * V, V, valid, w, lse[n], col);
  }
}

Status cross_entropy_fwd(const OpCall* call) {
  return guard([&] {
    CeShape s = op_checks::check_cross_entropy_fwd(call, false, DeviceType::kCuda);
    const TensorView& X = call->inputs[0];
    int device = current_device(ops::kCrossEntropyFwd, X);
    cudaStream_t stream = stream_of(call);
    LabelErrorSink sink = label_error_sink(device, stream);
    const float* mask = static_cast<const float*>(call->inputs[2].data);
    float* loss = static_cast<float*>(call->outputs[0].data);
    if (s.n > 0) {
      const int threads = row_threads(s.v);
      const unsigned blocks = static_cast<unsigned>(s.n < kMaxRowBlocks ? s.n : kMaxRowBlocks);
      LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, ops::kCrossEntropyFwd, {
        ce_fwd_kernel<T><<<blocks, threads, 0, stream>>>(
            static_cast<const T*>(X.data), static_cast<const int32_t*>(call->inputs[1].data), mask,
            loss, static_cast<float*>(call->outputs[1].data), s.n, s.v, s.valid, sink);
      });
      launch_check(ops::kCrossEntropyFwd);
    }
    launch_masked_mean(loss, mask, s.n, static_cast<float*>(call->outputs[2].data), stream,
                       ops::kCrossEntropyFwd);
  });
}

Status cross_entropy_bwd(const OpCall* call) {
  return guard([&] {
    CeShape s = op_checks::check_cross_entropy_bwd(call, false, DeviceType::kCuda);
    const TensorView &X = call->inputs[0], &dX = call->outputs[0];
    int device = current_device(ops::kCrossEntropyBwd, X);
    cudaStream_t stream = stream_of(call);
    LabelErrorSink sink = label_error_sink(device, stream);
    if (s.n == 0) return;
    const float* mask = static_cast<const float*>(call->inputs[2].data);
    double* total_dev = nullptr;
    if (mask != nullptr) {
      total_dev = static_cast<double*>(stream_scratch(device, stream).data);
      mask_total_kernel<<<1, kReduceThreads, 0, stream>>>(mask, s.n, total_dev);
      launch_check(ops::kCrossEntropyBwd);
    }
    const int threads = row_threads(s.v);
    const unsigned blocks = static_cast<unsigned>(s.n < kMaxRowBlocks ? s.n : kMaxRowBlocks);
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, ops::kCrossEntropyBwd, {
      LOOM_CUDA_FLOAT_SWITCH(dX.dtype, D, ops::kCrossEntropyBwd, {
        ce_bwd_kernel<T, D><<<blocks, threads, 0, stream>>>(
            static_cast<const T*>(X.data), static_cast<const int32_t*>(call->inputs[1].data), mask,
            static_cast<const float*>(call->inputs[3].data),
            static_cast<const float*>(call->inputs[4].data), total_dev, static_cast<double>(s.n),
            static_cast<D*>(dX.data), s.n, s.v, s.valid, s.start, s.vocab, sink);
      });
    });
    launch_check(ops::kCrossEntropyBwd);
  });
}

bool cross_entropy_fwd_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_cross_entropy_fwd(call, true, DeviceType::kCuda); });
}
bool cross_entropy_bwd_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_cross_entropy_bwd(call, true, DeviceType::kCuda); });
}

// Forward: max, exp, sum per logit; backward: exp, scale, store (the CPU kernels' counts).
Status cross_entropy_fwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_cross_entropy_fwd(call, true, DeviceType::kCuda);
    *out = io_cost(call, 4.0 * static_cast<double>(max_numel(call)));
  });
}
Status cross_entropy_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_cross_entropy_bwd(call, true, DeviceType::kCuda);
    *out = io_cost(call, 4.0 * static_cast<double>(max_numel(call)));
  });
}

}  // namespace

void launch_masked_mean(const float* loss, const float* mask, int64_t n, float* mean,
                        cudaStream_t stream, const char* op) {
  masked_mean_kernel<<<1, kReduceThreads, 0, stream>>>(loss, mask, n, mean);
  launch_check(op);
}

void add_cross_entropy_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kCrossEntropyFwd, cross_entropy_fwd, cross_entropy_fwd_supports,
                   cross_entropy_fwd_cost);
  add_cuda_kernels(out, ops::kCrossEntropyBwd, cross_entropy_bwd, cross_entropy_bwd_supports,
                   cross_entropy_bwd_cost);
}

}  // namespace loom::kernels::cuda::loss
