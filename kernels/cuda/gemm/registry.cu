// add_gemm_kernels (gemm.h): the kernel list of every op file of the family.
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/registry.cuh"

namespace loom::kernels::cuda {

void add_gemm_kernels(std::vector<KernelDesc>& out) {
  gemm::add_gemm_op_kernels(out);
  gemm::add_fp8_gemm_kernels(out);
  gemm::add_gemm_epilogue_kernels(out);
  gemm::add_gemm_tf32x3_kernels(out);
}

}  // namespace loom::kernels::cuda
