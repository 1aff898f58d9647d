// The op files of the blas family and what each appends to the kernel list (registry.cu).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda::blas {

void add_gemm_kernels(std::vector<KernelDesc>& out);                 // gemm.cu
void add_cross_entropy_kernels(std::vector<KernelDesc>& out);        // cross_entropy.cu
void add_cross_entropy_shard_kernels(std::vector<KernelDesc>& out);  // cross_entropy_shard.cu
void add_optim_kernels(std::vector<KernelDesc>& out);                // optim_steps.cu
void add_elementwise_kernels(std::vector<KernelDesc>& out);          // elementwise.cu
void add_bias_kernels(std::vector<KernelDesc>& out);                 // bias.cu
void add_reduction_kernels(std::vector<KernelDesc>& out);            // reductions.cu
void add_fp8_gemm_kernels(std::vector<KernelDesc>& out);             // fp8_gemm.cu
void add_fp8_scale_update_kernels(std::vector<KernelDesc>& out);     // fp8_scale_update.cu

/// The gemm kernel functions (gemm.cu), for gemm_bench.cu: CUBLAS_COMPUTE_32F, and TF32.
Status gemm_f32_accumulate(const OpCall* call);
Status gemm_tf32(const OpCall* call);

}  // namespace loom::kernels::cuda::blas
