// KernelDesc helpers of the CUDA kernel library.
#pragma once

#include <loom/kernel.h>
#include <loom/ops.h>

#include <initializer_list>
#include <vector>

namespace loom::kernels::cuda {

/// Name and priority of the CUDA kernels: above the CPU ones (which never serve CUDA
/// tensors anyway), below a third-party library that wants to win (priority > 20).
inline constexpr const char* kCudaName = "cuda";
inline constexpr int32_t kCudaPriority = 20;

/// Appends one KernelDesc of `op` per dtype in `dtypes` (by default every float dtype).
inline void add_cuda_kernels(std::vector<KernelDesc>& out, const char* op, KernelFn fn,
                             KernelSupportsFn supports, KernelCostFn cost,
                             std::initializer_list<DType> dtypes = {DType::kF32, DType::kBF16,
                                                                    DType::kF16},
                             const char* name = kCudaName, int32_t priority = kCudaPriority,
                             KernelWorkspaceFn workspace = nullptr) {
  for (DType t : dtypes) {
    KernelDesc k{};
    k.struct_size = sizeof(KernelDesc);
    k.op = op;
    k.op_version = ops::kVersion;
    k.device = DeviceType::kCuda;
    k.dtype = t;
    k.name = name;
    k.priority = priority;
    k.fn = fn;
    k.supports = supports;
    k.cost = cost;
    k.workspace = workspace;
    out.push_back(k);
  }
}

/// Bytes of every present input and output of `call`, and `flops` (an OpCost for
/// bandwidth-bound ops).
inline OpCost io_cost(const OpCall* call, double flops) {
  OpCost c{flops, 0.0, 0.0};
  for (int32_t i = 0; i < call->num_inputs; ++i)
    c.bytes_read += static_cast<double>(numel(call->inputs[i])) *
                    static_cast<double>(dtype_size(call->inputs[i].dtype));
  for (int32_t i = 0; i < call->num_outputs; ++i)
    c.bytes_written += static_cast<double>(numel(call->outputs[i])) *
                       static_cast<double>(dtype_size(call->outputs[i].dtype));
  return c;
}

}  // namespace loom::kernels::cuda
