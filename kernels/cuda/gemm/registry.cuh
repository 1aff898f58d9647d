// The op files of the gemm family and what each appends to its kernel list (registry.cu).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda::gemm {

void add_gemm_op_kernels(std::vector<KernelDesc>& out);        // gemm.cu: "cuda" and "cuda.tf32"
void add_fp8_gemm_kernels(std::vector<KernelDesc>& out);       // fp8_gemm.cu
void add_gemm_epilogue_kernels(std::vector<KernelDesc>& out);  // gemm_epilogue.cu

}  // namespace loom::kernels::cuda::gemm
