// KernelDesc helpers of the CUDA kernel library (io_cost comes from loom/cpp/kernel_descs.h).
#pragma once

#include <loom/cpp/kernel_descs.h>
#include <loom/kernel.h>

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
  append_kernel_descs(out, op, DeviceType::kCuda, dtypes, name, priority, fn, supports, cost,
                      workspace);
}

}  // namespace loom::kernels::cuda
