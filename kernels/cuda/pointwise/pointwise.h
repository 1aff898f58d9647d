// The pointwise CUDA kernels: activations (gelu, swiglu), dropout, embedding, layernorm,
// rmsnorm and their residual-add forms (add_layernorm_*, add_rmsnorm_*), rope, the head layout
// ops (split_qkv, merge_qkv, swap_axes_12), the masked softmax, fp8_quantize,
// swiglu_fp8_fwd / _bwd and rope_fp8_bwd of loom/ops.h, for CUDA tensors of every float dtype (f32,
// bf16, f16 storage, f32 arithmetic; the FP8 ops write E4M3 or E5M2). Plain C++: no CUDA types, so
// .cc code (the kernels_cuda plugin, the op tests) includes it without nvcc.
#pragma once

#include <loom/kernel.h>
#include <loom/status.h>

#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc (name "cuda", priority 20) per op and dtype of this library: the
/// ops above keyed on f32, bf16 and f16, and swap_axes_12 also on the other 2- and 4-byte
/// dtypes (i32, i16, u16). Every `supports` runs the shared checks of loom/cpp/op_checks for
/// CUDA tensors; layernorm_bwd, rmsnorm_bwd, add_layernorm_bwd and add_rmsnorm_bwd also have a
/// `workspace` function (see their files: with the workspace their weight gradients are
/// deterministic).
/// \param out  the list to append to
void add_pointwise_kernels(std::vector<KernelDesc>& out);

/// Out-of-range embedding ids are found on the GPU without the host waiting for it, so they
/// are reported one call late: the next embedding_fwd / embedding_bwd call on the same GPU
/// fails with kOutOfRange instead of running. This reports at once: it waits for the
/// current CUDA device, then returns kOutOfRange with the CPU kernels' message for the first
/// out-of-range id of the first failing call since the last report (and clears the record),
/// or kOk when there is none. For tests, and for the end of a run.
Status embedding_id_status() noexcept;

}  // namespace loom::kernels::cuda
