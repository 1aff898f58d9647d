#include "kernels/cuda/kernel_families.h"

#include "kernels/cuda/attention/attention.h"

namespace loom::kernels::cuda {

void add_all_kernels(std::vector<KernelDesc>& out) {
  add_attention_kernels(out);
}

}  // namespace loom::kernels::cuda
