// The CPU kernel library: a plain reference implementation ("cpu.ref", priority 0) of every
// op in loom/ops.h, the oracle that every other kernel is tested against, and a fast one
// ("cpu.fast", priority 10: OpenBLAS, OpenMP, AVX2) wherever it pays. Each is registered
// for f32, bf16 and f16 (the op's keyed dtype; the FP8 formats for fp8_gemm; f32 alone
// where that input is always f32,
// as cross_entropy_combine's stats). The plugin `kernels_cpu` registers exactly this list;
// tests call the kernels through it directly.
#pragma once

#include <loom/kernel.h>

#include <vector>

namespace loom::kernels::cpu {

/// Every kernel of the library, struct_size filled, in a stable order.
const std::vector<KernelDesc>& all_kernels();

/// The kernel `name` ("cpu.ref", "cpu.fast") of `op` for `dtype`, or null.
const KernelDesc* find_kernel(const char* op, DType dtype, const char* name);

}  // namespace loom::kernels::cpu
