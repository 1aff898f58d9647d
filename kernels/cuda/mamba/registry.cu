// add_mamba_kernels (mamba.h): the kernel list of every op file of the family.
#include "kernels/cuda/mamba/mamba.h"
#include "kernels/cuda/mamba/registry.cuh"

namespace loom::kernels::cuda {

void add_mamba_kernels(std::vector<KernelDesc>& out) {
  mamba::add_causal_conv1d_kernels(out);
  mamba::add_ssd_scan_kernels(out);
  mamba::add_rmsnorm_gated_kernels(out);
}

}  // namespace loom::kernels::cuda
