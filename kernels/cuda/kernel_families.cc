#include "kernels/cuda/kernel_families.h"

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/blas/blas.h"

namespace loom::kernels::cuda {

void add_all_kernels(std::vector<KernelDesc>& out) {
  add_blas_kernels(out);
  add_attention_kernels(out);
}

std::string take_recorded_error() { return take_label_error(); }

}  // namespace loom::kernels::cuda
