// The blas family of the CUDA kernel library: gemm through cuBLASLt, cross entropy (whole
// and vocab-parallel), the optimizer steps and the elementwise ops (add, bias_add,
// bias_grad, cast, scale, sumsq, amax), on CUDA tensors in f32, bf16 and f16; and FP8:
// fp8_gemm through cuBLASLt (A and B in fp8_e4m3 / fp8_e5m2; compute capability 8.9+) and
// fp8_scale_update (f32).
//
// Plain C++ (no CUDA types): the kernels_cuda plugin and the tests include it without nvcc.
#pragma once

#include <loom/kernel.h>

#include <string>
#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op and dtype of the family: name "cuda", priority 20
/// (kernels/cuda/common/registration.h), and for gemm on f32 also "cuda.tf32" (priority 15:
/// TF32 tensor cores, about 10 mantissa bits, used only when a spec pins it). fp8_gemm is
/// keyed on fp8_e4m3 and fp8_e5m2 (A's dtype), fp8_scale_update on f32. Each has `supports`
/// (shapes, dtypes and attributes only, never throws; fp8_gemm's also declines a device below
/// sm_89 and what cuBLASLt's FP8 kernels cannot run: K not a multiple of 16, rows of Y not a
/// multiple of 16 bytes, unaligned operands) and `cost`. The kernels launch on the current
/// device, which must be the device of the call's tensors, on the call's stream; none of them
/// synchronises the device.
void add_blas_kernels(std::vector<KernelDesc>& out);

/// Out-of-range labels of the cross-entropy kernels are found on the device, so the call
/// that met them cannot fail; the next cross-entropy call on that device does, with
/// kOutOfRange (kernels/cuda/blas/label_errors.cuh). This returns the message of such an
/// error that no call has reported yet, and clears it, or "" when there is none. Call it
/// after synchronising (a device runtime's `synchronize`, a test) to report the error at
/// once; errors of work still running are not seen.
std::string take_label_error();

}  // namespace loom::kernels::cuda
