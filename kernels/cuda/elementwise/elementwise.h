// The elementwise family of the CUDA kernel library: add, cast and scale, bias_add and
// bias_grad, and the whole-tensor reductions sumsq and amax (loom/ops.h, "Elementwise"), on
// CUDA tensors in f32, bf16 and f16; add (all three tensors f64) and cast (f64 on either side)
// also in f64, and keyed on f64 too (the fp64 router).
//
// Plain C++ (no CUDA types): the kernels_cuda plugin and the tests include it without nvcc.
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op and dtype of the family: name "cuda", priority 20
/// (kernels/cuda/common/registration.h). Each has `supports` (shapes, dtypes and attributes
/// only, never throws) and `cost`. The kernels launch on the current device, which must be
/// the device of the call's tensors, on the call's stream; none of them synchronises the
/// device.
/// \param out  the list to append to
void add_elementwise_kernels(std::vector<KernelDesc>& out);

}  // namespace loom::kernels::cuda
