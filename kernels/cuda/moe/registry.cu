// add_moe_kernels (moe.h): the kernel list of every op file of the family.
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/moe/registry.cuh"

namespace loom::kernels::cuda {

void add_moe_kernels(std::vector<KernelDesc>& out) {
  moe::add_topk_kernels(out);
  moe::add_topk_bwd_kernels(out);
  moe::add_permute_kernels(out);
  moe::add_unpermute_kernels(out);
  moe::add_grouped_gemm_kernels(out);
}

}  // namespace loom::kernels::cuda
