// The 3xTF32 GEMM's driver (gemm_tf32x3.cu), shared by gemm's and gemm_epilogue's
// "cuda.tf32x3" kernels. tf32x3.cuh explains the method and the layout, tf32x3_plan.h the
// chunks.
#pragma once

#include <cuda_runtime.h>
#include <loom/kernel.h>

#include <cstddef>

#include "kernels/cuda/gemm/tf32x3_plan.h"

namespace loom::kernels::cuda::gemm {

/// Most workspace bytes a 3xTF32 call asks of the host (loom::Kernel's KernelDesc::workspace):
/// longer contractions run as several chunks in it.
inline constexpr size_t kTf32x3MaxWorkspace = size_t{256} << 20;

/// The workspace a call of shape `s` asks for: 0 in registers (the default form); in the
/// split form its split operands whole when they fit kTf32x3MaxWorkspace, else the widest
/// chunk that does (at least 4 columns of K), and 0 under LOOM_TF32X3_WORKSPACE=scratch
/// (run_tf32x3 then splits into the stream scratch); 0 when K == 0. This and run_tf32x3
/// choose the form alike: `s.form` (with `s.segments` 2 or 3 for the split form) when not
/// kAuto, else LOOM_TF32X3=auto|registers|split|one|two (gemm_tf32x3.cu's with_form).
size_t tf32x3_workspace(const Tf32x3Shape& s);

/// Adds to `out` (the plain GEMM's cost of the call: 2 M N K flops, its operands and Y)
/// what 3xTF32 does besides: three products instead of one; in the split form also the split
/// operands written and read by the matmuls, and in its two-matmul form Y read and written
/// once more. The form is chosen as run_tf32x3 chooses it.
void add_tf32x3_cost(const Tf32x3Shape& s, OpCost* out);

/// Y = alpha op(A) op(B) + beta Y (+ bias over Y's columns when `bias` is not null), gemm's
/// semantics (loom/ops/gemm.h) for f32 A, B, Y and bias, in 3xTF32 on the current device and
/// `stream`: in registers, one GEMM kernel (two launches for a split contraction, its partial
/// sums in the stream scratch: tf32x3_mma.cuh); in the split form, a split kernel and one or
/// two TF32 cuBLASLt GEMMs per chunk of K (the form as tf32x3_workspace says).
/// \param op         the op named in errors
/// \param s          the problem (batch, M, N, K, transposes, shared B, form)
/// \param workspace  the split form's device memory for the split operands, `workspace_bytes`
///                   long; null (or LOOM_TF32X3_WORKSPACE=scratch): the upper half of the
///                   stream scratch (common/resources.cuh), in more chunks. Unused in registers.
/// \param beta       0 never reads Y (it may hold NaN)
/// \param act        applied to each element after alpha, beta and the bias (in registers
///                   only, and with K > 0: callers check tf32x3_in_registers)
/// Throws Error naming `op` when even one chunk of 4 columns does not fit the workspace, when
/// Y has more columns than the in-register grid covers (65535 tiles), or when cuBLASLt or a
/// launch fails.
void run_tf32x3(const char* op, const Tf32x3Shape& s, const float* A, const float* B, float* Y,
                float alpha, float beta, const float* bias, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, int device, const Tf32x3Activation& act = {});

/// Whether a call of shape `s` runs in registers (as run_tf32x3 and tf32x3_workspace choose
/// its form): only that form takes an activation.
bool tf32x3_in_registers(const Tf32x3Shape& s);

}  // namespace loom::kernels::cuda::gemm
