// The op files of the gemm family and what each appends to its kernel list (registry.cu).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda::gemm {

void add_gemm_op_kernels(std::vector<KernelDesc>& out);   // gemm.cu: "cuda" and "cuda.tf32"
void add_fp8_gemm_kernels(std::vector<KernelDesc>& out);  // fp8_gemm.cu
void add_gemm_epilogue_kernels(
    std::vector<KernelDesc>& out);  // gemm_epilogue.cu: "cuda", "cuda.tf32x3"
void add_gemm_tf32x3_kernels(std::vector<KernelDesc>& out);  // gemm_tf32x3.cu: gemm's "cuda.tf32x3"

}  // namespace loom::kernels::cuda::gemm
