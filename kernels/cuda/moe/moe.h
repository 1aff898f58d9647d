// The mixture-of-experts family of the CUDA kernel library (loom/ops/moe.h): moe_topk and
// moe_topk_bwd (f32 or f64 tensors, f64 arithmetic as the CPU reference), moe_permute,
// moe_unpermute and moe_unpermute_bwd (f32, bf16, f16 storage, f32 arithmetic; dweights summed
// in f64), grouped_gemm and grouped_gemm_wgrad (cuBLAS, f32 compute).
//
// Plain C++ (no CUDA types): the kernels_cuda plugin and the tests include it without nvcc.
#pragma once

#include <loom/kernel.h>

#include <string>
#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op and dtype of the family: name "cuda", priority 20
/// (kernels/cuda/common/registration.h). moe_topk and moe_topk_bwd are keyed on f32 and f64
/// (the logits' dtype: the fp32 and fp64 router), the others on f32, bf16 and f16. Each has `supports` (the shared checks of
/// loom/cpp/op_checks/moe.h for CUDA tensors, shapes only, never throws; moe_topk's also
/// declines more than 1024 expert groups, the grouped GEMMs what cuBLAS cannot run: operands
/// of two dtypes, an output in the other 16-bit dtype, extents past int32) and `cost` (the
/// CPU reference's formulas). The
/// kernels launch on the current device, which must be the device of the call's tensors, on
/// the call's stream; none of them synchronises the device.
/// \param out  the list to append to
void add_moe_kernels(std::vector<KernelDesc>& out);

/// Out-of-range indices (moe_topk_bwd's expert ids, moe_permute's src, the slot_rows and
/// row_slots of moe_unpermute / moe_unpermute_bwd) are found on the device, so the call that
/// met them cannot fail: it treats them as dropped (a zero row, no term), and the next call
/// on that device of one of these four ops fails with kOutOfRange and the CPU kernels'
/// message (kernels/cuda/moe/index_errors.cuh).
/// This returns the message of such an error that no call has reported yet, and clears it,
/// or "" when there is none. Call it after synchronising; errors of work still running are
/// not seen.
std::string take_moe_index_error();

}  // namespace loom::kernels::cuda
