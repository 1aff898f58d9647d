// The op files of the loss family and what each appends to its kernel list (registry.cu).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda::loss {

void add_cross_entropy_kernels(std::vector<KernelDesc>& out);        // cross_entropy.cu
void add_cross_entropy_shard_kernels(std::vector<KernelDesc>& out);  // cross_entropy_shard.cu
void add_masked_sum_kernels(std::vector<KernelDesc>& out);           // masked_sum.cu

}  // namespace loom::kernels::cuda::loss
