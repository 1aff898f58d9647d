// cross_entropy_fwd / cross_entropy_bwd / cross_entropy_fwd_bwd (loom/ops.h) on CUDA; the row
// kernels are in cross_entropy_kernel.cuh.
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
// Forward and backward in one pass (cross_entropy_fwd_bwd, when the loss's gradient dmean is
// known before the forward): one block per row folds the row, thread 0 writes lse and loss
// and hands lse to the block through shared memory, then the block writes the row's gradient.
// Where two blocks' rows fit in a multiprocessor's shared memory (GPT-2's padded 50304 bf16
// logits: 98 KiB a row), the block first copies its row there and both passes read that copy,
// so the logits leave device memory once; otherwise the second pass reads them again (mostly
// from L2). Same fold, same lse and same formula as the two kernels above: bit for bit their
// results. In place (dlogits = logits) a row is read whole (thread 0's label read included)
// before the barrier that precedes its writes.
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
#include "kernels/cuda/loss/cross_entropy_kernel.cuh"
#include "kernels/cuda/loss/label_errors.cuh"
#include "kernels/cuda/loss/registry.cuh"

namespace loom::kernels::cuda::loss {
namespace {

using op_checks::CeShape;

constexpr int kReduceThreads = 1024;  // the one-block reductions over N rows

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

// sum(mask) in f64 in the stream's scratch, which every row's gradient weight needs before
// any row is written; null without a mask (the total is then N, known on the host).
const double* launch_mask_total(const float* mask, int64_t n, int device, cudaStream_t stream,
                                const char* op) {
  if (mask == nullptr) return nullptr;
  auto* total = static_cast<double*>(stream_scratch(device, stream).data);
  mask_total_kernel<<<1, kReduceThreads, 0, stream>>>(mask, n, total);
  launch_check(op);
  return total;
}

// The dynamic shared memory of a staged row of V elements of `elem` bytes, or 0 when two
// blocks' rows would not fit in a multiprocessor of `device` (then the rows are read twice).
size_t staged_row_bytes(int device, int64_t V, size_t elem) {
  const size_t bytes = static_cast<size_t>(V) * elem + 16;
  // Two blocks a multiprocessor, each with ~1 KiB the runtime reserves and the kernel's
  // static shared memory (block_max_sum's partials, row_lse) besides its row.
  constexpr size_t kPerBlockExtra = 2048;
  const size_t per_sm = static_cast<size_t>(shared_memory_per_multiprocessor(device));
  return 2 * (bytes + kPerBlockExtra) <= per_sm ? bytes : 0;
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
    const double* total_dev = launch_mask_total(mask, s.n, device, stream, ops::kCrossEntropyBwd);
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

Status cross_entropy_fwd_bwd(const OpCall* call) {
  return guard([&] {
    CeShape s = op_checks::check_cross_entropy_fwd_bwd(call, false, DeviceType::kCuda);
    const TensorView &X = call->inputs[0], &dX = call->outputs[3];
    int device = current_device(ops::kCrossEntropyFwdBwd, X);
    cudaStream_t stream = stream_of(call);
    LabelErrorSink sink = label_error_sink(device, stream);
    const float* mask = static_cast<const float*>(call->inputs[2].data);
    float* loss = static_cast<float*>(call->outputs[0].data);
    if (s.n > 0) {
      const double* total_dev =
          launch_mask_total(mask, s.n, device, stream, ops::kCrossEntropyFwdBwd);
      const int threads = row_threads(s.v);
      const unsigned blocks = static_cast<unsigned>(s.n < kMaxRowBlocks ? s.n : kMaxRowBlocks);
      const size_t staged = staged_row_bytes(device, s.v, dtype_size(X.dtype));
      LOOM_CUDA_FLOAT_SWITCH(X.dtype, T, ops::kCrossEntropyFwdBwd, {
        LOOM_CUDA_FLOAT_SWITCH(dX.dtype, D, ops::kCrossEntropyFwdBwd, {
          auto kernel = staged > 0 ? ce_fwd_bwd_kernel<T, D, true> : ce_fwd_bwd_kernel<T, D, false>;
          if (staged > 0) {  // room for two rows a multiprocessor: all of it shared memory
            allow_dynamic_smem(kernel, staged, ops::kCrossEntropyFwdBwd);
            cuda_check(
                cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared),
                "cross_entropy_fwd_bwd: cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
          }
          kernel<<<blocks, threads, staged, stream>>>(
              static_cast<const T*>(X.data), static_cast<const int32_t*>(call->inputs[1].data),
              mask, loss, static_cast<float*>(call->outputs[1].data),
              static_cast<const float*>(call->inputs[3].data), total_dev, static_cast<double>(s.n),
              static_cast<D*>(dX.data), s.n, s.v, s.valid, sink);
        });
      });
      launch_check(ops::kCrossEntropyFwdBwd);
    }
    launch_masked_mean(loss, mask, s.n, static_cast<float*>(call->outputs[2].data), stream,
                       ops::kCrossEntropyFwdBwd);
  });
}

bool cross_entropy_fwd_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_cross_entropy_fwd(call, true, DeviceType::kCuda); });
}
bool cross_entropy_bwd_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_cross_entropy_bwd(call, true, DeviceType::kCuda); });
}
bool cross_entropy_fwd_bwd_supports(const OpCall* call) {
  return check_passes(
      [&] { op_checks::check_cross_entropy_fwd_bwd(call, true, DeviceType::kCuda); });
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
// Both in one pass: the two ops' counts.
Status cross_entropy_fwd_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_cross_entropy_fwd_bwd(call, true, DeviceType::kCuda);
    *out = io_cost(call, 8.0 * static_cast<double>(max_numel(call)));
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
  add_cuda_kernels(out, ops::kCrossEntropyFwdBwd, cross_entropy_fwd_bwd,
                   cross_entropy_fwd_bwd_supports, cross_entropy_fwd_bwd_cost);
}

}  // namespace loom::kernels::cuda::loss
