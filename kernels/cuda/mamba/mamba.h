// The Mamba-2 family of the CUDA kernel library (loom/ops/mamba.h): causal_conv1d and its
// backward, ssd_scan and its backward (the SSD chunked scan), rmsnorm_gated and its backward;
// f32, bf16 and f16 storage, f32 arithmetic and states.
//
// Plain C++ (no CUDA types): the kernels_cuda plugin and the tests include it without nvcc.
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op of the family and each of f32, bf16, f16: name "cuda",
/// priority 20 (kernels/cuda/common/registration.h). Each has `supports` (the shared checks
/// of loom/cpp/op_checks/mamba.h for CUDA tensors, shapes only, never throws; ssd_scan's also
/// declines a state dim too large for its shared memory) and `cost`; ssd_scan_bwd has a
/// workspace function (the chunk states of a recomputed forward and f32 gradient
/// accumulators), which it needs. The kernels launch on the current device, which must be the
/// device of the call's tensors, on the call's stream; none synchronises the device. Sums
/// across threads (dweight, dbias, dB, dC, ddt, dA_log, dD) use float atomics, so their last
/// bits may vary run to run.
/// \param out  the list to append to
void add_mamba_kernels(std::vector<KernelDesc>& out);

}  // namespace loom::kernels::cuda
