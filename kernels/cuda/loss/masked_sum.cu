// masked_sum (loom/ops.h) on CUDA: [sum_n mask[n] x[n], sum_n mask[n]] (without a mask:
// [sum_n x[n], N]) of f32 vectors, the (sum, tokens) a model reports its loss with. One
// block of 1024 threads accumulates both in f64 (as the CPU reference does) and thread 0
// stores them as f32: a reduction over one micro-batch's tokens, once per micro-batch, with
// no host sync.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/cross_entropy.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/loss/registry.cuh"

namespace loom::kernels::cuda::loss {
namespace {

constexpr int kThreads = 1024;

__global__ void masked_sum_kernel(const float* __restrict__ x, const float* __restrict__ mask,
                                  int64_t n, float* __restrict__ out) {
  double sum = 0.0, count = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double w = mask != nullptr ? mask[i] : 1.0;
    sum += w * x[i];
    count += w;
  }
  sum = block_sum(sum);
  count = block_sum(count);
  if (threadIdx.x == 0) {
    out[0] = static_cast<float>(sum);
    out[1] = static_cast<float>(count);
  }
}

Status masked_sum(const OpCall* call) {
  return guard([&] {
    int64_t n = op_checks::check_masked_sum(call, false, DeviceType::kCuda);
    current_device(ops::kMaskedSum, call->outputs[0]);
    masked_sum_kernel<<<1, kThreads, 0, stream_of(call)>>>(
        static_cast<const float*>(call->inputs[0].data),
        static_cast<const float*>(call->inputs[1].data), n,
        static_cast<float*>(call->outputs[0].data));
    launch_check(ops::kMaskedSum);
  });
}

bool masked_sum_supports(const OpCall* call) {
  return check_passes([&] { op_checks::check_masked_sum(call, true, DeviceType::kCuda); });
}

Status masked_sum_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::check_masked_sum(call, true, DeviceType::kCuda);
    *out = io_cost(call, 2.0 * static_cast<double>(max_numel(call)));
  });
}

}  // namespace

void add_masked_sum_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kMaskedSum, masked_sum, masked_sum_supports, masked_sum_cost,
                   {DType::kF32});
}

}  // namespace loom::kernels::cuda::loss
