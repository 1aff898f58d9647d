// add_optim_kernels (optim.h): the kernel list of every op file of the family.
#include "kernels/cuda/optim/optim.h"
#include "kernels/cuda/optim/registry.cuh"

namespace loom::kernels::cuda {

void add_optim_kernels(std::vector<KernelDesc>& out) {
  optim::add_step_kernels(out);
  optim::add_fp8_scale_update_kernels(out);
}

}  // namespace loom::kernels::cuda
