// Every CUDA kernel of loom, gathered from the kernel families (one package each), for the
// `kernels_cuda` plugin and for the op tests that run the CUDA kernels against the CPU
// reference.
#pragma once

#include <loom/kernel.h>

#include <string>
#include <vector>

namespace loom::kernels::cuda {

/// Appends the KernelDescs of every family (device kCuda, name "cuda" unless a family says
/// otherwise), struct_size filled.
void add_all_kernels(std::vector<KernelDesc>& out);

/// The message of an error a kernel recorded on the device and no call has reported yet
/// (an out-of-range label, embedding id or moe index), cleared; "" when there is none. Call
/// after synchronising.
std::string take_recorded_error();

}  // namespace loom::kernels::cuda
