// add_elementwise_kernels (elementwise.h): the kernel list of every op file of the family.
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/elementwise/registry.cuh"

namespace loom::kernels::cuda {

void add_elementwise_kernels(std::vector<KernelDesc>& out) {
  elementwise::add_map_kernels(out);
  elementwise::add_bias_kernels(out);
  elementwise::add_reduction_kernels(out);
}

}  // namespace loom::kernels::cuda
