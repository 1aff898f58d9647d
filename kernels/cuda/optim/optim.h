// The optimizer family of the CUDA kernel library: adamw_step, adamw_step_multi and sgd_step
// (loom/ops.h) on contiguous f32 shards, keyed on the grad's dtype (f32, bf16, f16), and FP8
// delayed scaling (fp8_scale_update, f32).
//
// Plain C++ (no CUDA types): the kernels_cuda plugin and the tests include it without nvcc.
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op and dtype of the family: name "cuda", priority 20
/// (kernels/cuda/common/registration.h); fp8_scale_update is keyed on f32. Each has
/// `supports` (shapes, dtypes and attributes only, never throws) and `cost`. The kernels
/// launch on the current device, which must be the device of the call's tensors, on the
/// call's stream; none of them synchronises the device.
/// \param out  the list to append to
void add_optim_kernels(std::vector<KernelDesc>& out);

}  // namespace loom::kernels::cuda
