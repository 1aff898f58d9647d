// The op files of the optimizer family and what each appends to its kernel list
// (registry.cu).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda::optim {

void add_step_kernels(std::vector<KernelDesc>& out);              // optim_steps.cu
void add_fp8_scale_update_kernels(std::vector<KernelDesc>& out);  // fp8_scale_update.cu

}  // namespace loom::kernels::cuda::optim
