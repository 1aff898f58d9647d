// The gemm family of the CUDA kernel library: gemm (loom/ops.h) through cuBLASLt on f32,
// bf16, f16 and f64, gemm_epilogue (cuBLASLt's bias, GELU, dGELU and bias-gradient
// epilogues) on f32, bf16 and f16, and fp8_gemm through cuBLASLt (A and B in fp8_e4m3 /
// fp8_e5m2; compute capability 8.9+).
//
// Plain C++ (no CUDA types): the kernels_cuda plugin, the tests and the lab's gemm_bench
// include it without nvcc.
#pragma once

#include <loom/kernel.h>
#include <loom/status.h>

#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op and dtype of the family (gemm, fp8_gemm and
/// gemm_epilogue, whose cuBLASLt epilogues fall back to the library's unfused kernels where
/// cuBLASLt has no algorithm: gemm_epilogue.cu): name "cuda", priority 20
/// (kernels/cuda/common/registration.h), and for gemm and gemm_epilogue on f32 also
/// "cuda.tf32x3" (priority 16: f32 accuracy from three TF32 tensor-core products, used only
/// when a spec pins it) and for gemm "cuda.tf32" (priority 15: TF32 tensor cores, about 10
/// mantissa bits, used only when a spec pins it). fp8_gemm is
/// keyed on fp8_e4m3 and fp8_e5m2 (A's dtype). Each has `supports` (shapes, dtypes and
/// attributes only, never throws; fp8_gemm's also declines a device below sm_89 and what
/// cuBLASLt's FP8 kernels cannot run: K not a multiple of 16, rows of Y not a multiple of 16
/// bytes, unaligned operands) and `cost`. gemm, fp8_gemm and gemm_epilogue run the first
/// algorithm of cuBLASLt's heuristic for each problem, or under LOOM_GEMM_ALGO=measured the
/// fastest of its first 8, timed once per problem (cublaslt.cuh's choose_algo; not the 3xTF32
/// kernel's split form). The kernels launch on the current device, which must be the device
/// of the call's tensors, on the call's stream; none of them synchronises the device.
/// \param out  the list to append to
void add_gemm_kernels(std::vector<KernelDesc>& out);

/// The KernelFn of gemm's "cuda" kernel as add_gemm_kernels registers it: CUBLAS_COMPUTE_32F
/// (f32 operands in full f32, bf16 / f16 on tensor cores with f32 accumulation). Exposed for
/// the lab's gemm_bench (kernels/cuda/lab), which calls it as a module does.
/// \param call  a gemm call (loom/ops.h) on CUDA tensors of the current device
/// \return      kOk, or the error of a bad call or of cuBLASLt
Status gemm_f32_accumulate(const OpCall* call);

/// The KernelFn of gemm's "cuda" kernel keyed on f64: A, B and Y all f64, CUBLAS_COMPUTE_64F
/// (cuBLASLt's DGEMM; the fp64 router's GEMMs). The same code as gemm_f32_accumulate, which
/// would run an f64 call alike; registered apart so that its name says what it computes.
/// \param call  a gemm call on f64 CUDA tensors of the current device
/// \return      kOk, or the error of a bad call or of cuBLASLt
Status gemm_f64(const OpCall* call);

/// The KernelFn of gemm's "cuda.tf32" kernel: CUBLAS_COMPUTE_32F_FAST_TF32, f32 only. Exposed
/// for the lab's gemm_bench, as gemm_f32_accumulate.
/// \param call  a gemm call on f32 CUDA tensors of the current device
/// \return      kOk, or the error of a bad call or of cuBLASLt
Status gemm_tf32(const OpCall* call);

/// The KernelFn of gemm's "cuda.tf32x3" kernel (gemm_tf32x3.cu): f32 at f32 accuracy on TF32
/// tensor cores, each operand split into a TF32 part and its remainder and three products
/// summed (tf32x3.cuh). By default loom's own GEMM kernel splits in registers (tf32x3_mma.cuh,
/// no workspace); under LOOM_TF32X3=split|one|two the split goes to the workspace its
/// KernelDesc declares (loom::Kernel allocates it; a call without one splits K into chunks
/// that fit half the stream scratch) and cuBLASLt's TF32 GEMMs sum it.
/// Exposed for the lab's gemm_bench, as gemm_f32_accumulate.
/// \param call  a gemm call on f32 CUDA tensors of the current device
/// \return      kOk, or the error of a bad call or of cuBLASLt
Status gemm_tf32x3(const OpCall* call);

/// The KernelFn of fp8_gemm's "cuda" kernel (fp8_gemm.cu: cuBLASLt's FP8 GEMM in its TN
/// layout). Exposed for the lab's gemm_bench, as gemm_f32_accumulate.
/// \param call  an fp8_gemm call (loom/ops/fp8.h) on CUDA tensors of the current device
/// \return      kOk, or the error of a bad call, of a device or shape cuBLASLt's FP8 kernels
///              do not take (kUnimplemented), or of cuBLASLt
Status fp8_gemm_cublaslt(const OpCall* call);

/// The workspace bytes gemm's "cuda.tf32x3" kernel declares for `call` (its
/// KernelDesc::workspace): 0 in registers (the default); in the split form the split
/// operands, at most 256 MiB (longer K runs in chunks).
/// \param call  a gemm call (shapes only are read)
/// \return      bytes, 0 for a call the kernel does not take or with K == 0
uint64_t gemm_tf32x3_workspace(const OpCall* call);

}  // namespace loom::kernels::cuda
