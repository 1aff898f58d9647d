// add_blas_kernels (blas.h): the kernel list of every op file of the family.
#include "kernels/cuda/blas/blas.h"
#include "kernels/cuda/blas/families.cuh"

namespace loom::kernels::cuda {

void add_blas_kernels(std::vector<KernelDesc>& out) {
  blas::add_gemm_kernels(out);
  blas::add_cross_entropy_kernels(out);
  blas::add_cross_entropy_shard_kernels(out);
  blas::add_optim_kernels(out);
  blas::add_elementwise_kernels(out);
  blas::add_bias_kernels(out);
  blas::add_reduction_kernels(out);
  blas::add_fp8_gemm_kernels(out);
  blas::add_fp8_scale_update_kernels(out);
}

}  // namespace loom::kernels::cuda
