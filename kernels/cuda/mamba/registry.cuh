// The op files of the mamba family and what each appends to its kernel list (registry.cu).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda::mamba {

void add_causal_conv1d_kernels(std::vector<KernelDesc>& out);  // causal_conv1d.cu: and bwd
void add_ssd_scan_kernels(std::vector<KernelDesc>& out);       // ssd_scan.cu: and bwd
void add_rmsnorm_gated_kernels(std::vector<KernelDesc>& out);  // rmsnorm_gated.cu: and bwd

}  // namespace loom::kernels::cuda::mamba
