// The multi-latent attention family of the CUDA kernel library (loom/ops/mla.h): mla_qkv,
// mla_qkv_bwd, mla_out, mla_out_bwd; f32, bf16 and f16. Copies of the storage type (bit
// exact) but dkpe, the f32 head sum of mla_qkv_bwd.
//
// Plain C++ (no CUDA types): the kernels_cuda plugin and the tests include it without nvcc.
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op of the family and each of f32, bf16, f16: name "cuda",
/// priority 20 (kernels/cuda/common/registration.h). Each has `supports` (the shared checks
/// of loom/cpp/op_checks/mla.h for CUDA tensors, shapes only, never throws) and `cost`; none
/// needs a workspace. The kernels launch on the current device, which must be the device of
/// the call's tensors, on the call's stream; none synchronises the device, and every result
/// is deterministic.
/// \param out  the list to append to
void add_mla_kernels(std::vector<KernelDesc>& out);

}  // namespace loom::kernels::cuda
