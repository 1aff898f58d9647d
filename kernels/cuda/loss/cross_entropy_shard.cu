// Vocab-parallel cross entropy (loom/ops.h) on CUDA: cross_entropy_shard_stats and
// cross_entropy_combine.
//
// Shard stats: one block per row (grid-stride beyond 2^20 rows) folds this shard's V logits
// into the online (max, sum of exp) of cross_entropy.cuh in one pass of 16-byte loads;
// thread 0 writes (m, s, t), t read directly at column labels[n] - vocab_start when the label
// is in this shard. The shard's padding columns (CeShape::valid) are left out; a shard with
// no vocabulary columns gives (-inf, 0, 0), which combine ignores.
// Combine: the (P, N, 3) stats are tiny (P shards, usually <= 8), so one thread per row
// merges its P triples in f64 as the CPU reference does; then the masked mean of
// cross_entropy.cu (one block, f64, on the device).
//
// Labels outside [0, vocab_size) with mask != 0 are reported lazily as kOutOfRange
// (label_errors.cuh): shard stats give such a row t = 0, combine a NaN loss.
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
using op_checks::CombineShape;

template <class T>
__global__ void shard_stats_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                                   const float* __restrict__ mask, float* __restrict__ stats,
                                   int64_t N, int64_t V, int64_t valid, int64_t start,
                                   int64_t vocab, LabelErrorSink sink) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;  // columns [valid, V) are padding
    const MaxSum ms = block_max_sum(row_max_sum(row, valid));
    if (threadIdx.x == 0) {
      const int32_t label = labels[n];
      const int64_t col = label - start;
      float* st = stats + n * 3;
      st[0] = ms.m;
      st[1] = ms.s;
      st[2] = col >= 0 && col < valid ? to_f32<T>(row[col]) : 0.0f;
      const float w = mask != nullptr ? mask[n] : 1.0f;
      if (w != 0.0f && (label < 0 || label >= vocab))
        report_label_error(sink, LabelOp::kShardStats, n, label, vocab);
    }
  }
}

__global__ void combine_kernel(const float* __restrict__ stats, const int32_t* __restrict__ labels,
                               const float* __restrict__ mask, float* __restrict__ loss,
                               float* __restrict__ lse, int64_t P, int64_t N, int64_t vocab,
                               LabelErrorSink sink) {
  for (int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; n < N;
       n += int64_t{gridDim.x} * blockDim.x) {
    double m = -INFINITY, t = 0.0;
    for (int64_t p = 0; p < P; ++p) {
      const float* st = stats + (p * N + n) * 3;
      m = fmax(m, static_cast<double>(st[0]));
      t += st[2];
    }
    double sum = 0.0;
    for (int64_t p = 0; p < P; ++p) {
      const float* st = stats + (p * N + n) * 3;
      if (st[1] != 0.0f) sum += st[1] * exp(st[0] - m);  // empty shards add nothing
    }
    const double l = m + log(sum);
    lse[n] = static_cast<float>(l);
    const int32_t label = labels[n];
    if (label >= 0 && label < vocab) {
      loss[n] = static_cast<float>(l - t);
    } else if ((mask != nullptr ? mask[n] : 1.0f) != 0.0f) {
      report_label_error(sink, LabelOp::kCombine, n, label, vocab);
      loss[n] = NAN;
    } else {
      loss[n] = 0.0f;
    }
  }
}

Status cross_entropy_shard_stats(const OpCall* call) {
  return guard([&] {
    CeShape s = op_checks::check_cross_entropy_shard_stats(call, false, DeviceType::kCuda);
    const TensorView& X = call->inputs[0];
    int device = current_device(ops::kCrossEntropyShardStats, X);
    cudaStream_t stream = stream_of(call);
    LabelErrorSink sink = label_error_sink(device, stream);
    if (s.n == 0) return;
    const int threads = row_threads(s.v);
    const unsigned blocks = static_cast<unsigned>(s.n < kMaxRowBlocks ? s.n : kMaxRowBlocks);
    LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, ops::kCrossEntropyShardStats, {
      shard_stats_kernel<T><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(X.data), static_cast<const int32_t*>(call->inputs[1].data),
          static_cast<const float*>(call->inputs[2].data),
          static_cast<float*>(call->outputs[0].data), s.n, s.v, s.valid, s.start, s.vocab, sink);
    });
    launch_check(ops::kCrossEntropyShardStats);
  });
}

Status cross_entropy_combine(const OpCall* call) {
  return guard([&] {
    CombineShape c = op_checks::check_cross_entropy_combine(call, false, DeviceType::kCuda);
    const TensorView& stats = call->inputs[0];
    int device = current_device(ops::kCrossEntropyCombine, stats);
    cudaStream_t stream = stream_of(call);
    LabelErrorSink sink = label_error_sink(device, stream);
    const float* mask = static_cast<const float*>(call->inputs[2].data);
    float* loss = static_cast<float*>(call->outputs[0].data);
    if (c.n > 0) {
      combine_kernel<<<grid_for(c.n, kThreads), kThreads, 0, stream>>>(
          static_cast<const float*>(stats.data), static_cast<const int32_t*>(call->inputs[1].data),
          mask, loss, static_cast<float*>(call->outputs[1].data), c.p, c.n, c.vocab, sink);
      launch_check(ops::kCrossEntropyCombine);
    }
    launch_masked_mean(loss, mask, c.n, static_cast<float*>(call->outputs[2].data), stream,
                       ops::kCrossEntropyCombine);
  });
}

bool cross_entropy_shard_stats_supports(const OpCall* call) {
  return check_passes(
      [&] { op_checks::check_cross_entropy_shard_stats(call, true, DeviceType::kCuda); });
}
bool cross_entropy_combine_supports(const OpCall* call) {
  return check_passes(
      [&] { op_checks::check_cross_entropy_combine(call, true, DeviceType::kCuda); });
}

// Shard stats: max, exp, sum per logit; combine: a max, exp and sum per stats triple (the
// CPU kernels' counts).
Status cross_entropy_shard_stats_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_cross_entropy_shard_stats(call, true, DeviceType::kCuda);
    *out = io_cost(call, 3.0 * static_cast<double>(max_numel(call)));
  });
}
Status cross_entropy_combine_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_cross_entropy_combine(call, true, DeviceType::kCuda);
    *out = io_cost(call, 1.0 * static_cast<double>(max_numel(call)));
  });
}

}  // namespace

void add_cross_entropy_shard_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kCrossEntropyShardStats, cross_entropy_shard_stats,
                   cross_entropy_shard_stats_supports, cross_entropy_shard_stats_cost);
  // Combine reads only f32 stats: keyed on f32 alone, as on the CPU.
  add_cuda_kernels(out, ops::kCrossEntropyCombine, cross_entropy_combine,
                   cross_entropy_combine_supports, cross_entropy_combine_cost, {DType::kF32});
}

}  // namespace loom::kernels::cuda::loss
