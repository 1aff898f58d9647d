// The op files of the moe family and what each appends to its kernel list (registry.cu).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda::moe {

void add_topk_kernels(std::vector<KernelDesc>& out);          // topk.cu: moe_topk
void add_topk_bwd_kernels(std::vector<KernelDesc>& out);      // topk_bwd.cu: moe_topk_bwd
void add_permute_kernels(std::vector<KernelDesc>& out);       // permute.cu: moe_permute
void add_unpermute_kernels(std::vector<KernelDesc>& out);     // unpermute.cu: and its bwd
void add_grouped_gemm_kernels(std::vector<KernelDesc>& out);  // grouped_gemm.cu: and wgrad

}  // namespace loom::kernels::cuda::moe
