// add_loss_kernels (loss.h): the kernel list of every op file of the family.
#include "kernels/cuda/loss/loss.h"
#include "kernels/cuda/loss/registry.cuh"

namespace loom::kernels::cuda {

void add_loss_kernels(std::vector<KernelDesc>& out) {
  loss::add_cross_entropy_kernels(out);
  loss::add_cross_entropy_shard_kernels(out);
  loss::add_masked_sum_kernels(out);
}

}  // namespace loom::kernels::cuda
