// CUDA kernels of attention_fwd, attention_bwd and attention_merge (loom/ops.h).
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cuda {

/// Appends the KernelDescs of attention_fwd and attention_bwd for f32, bf16 and f16 (keyed
/// on Q's dtype; name "cuda", priority 20). Each accepts every call the CPU reference
/// accepts with CUDA tensors and a head dim D <= 4096: bf16 / f16 with D in {64, 128}
/// (every tensor of Q's dtype, 16-byte aligned) run the FlashAttention-2 tensor-core
/// kernels, the rest a generic kernel. attention_bwd needs the workspace its KernelDesc's
/// `workspace` reports (the f32 dQ accumulator and the softmax row sums).
/// \param out  the list to append to
void add_attention_kernels(std::vector<loom::KernelDesc>& out);

/// Appends the KernelDescs of attention_merge (f32, bf16 and f16, keyed on O's dtype): one
/// warp per row, any head dim and mix of float dtypes.
/// \param out  the list to append to
void add_attention_merge_kernels(std::vector<loom::KernelDesc>& out);

}  // namespace loom::kernels::cuda
