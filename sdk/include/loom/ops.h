// The op catalogue: name, version, inputs, outputs and attributes of every op that modules
// call through IHost::find_kernel (loom/kernel.h). Kernel libraries (kernels/cpu,
// kernels/cuda, third-party) implement these contracts; the CPU reference implementation
// of each op is the oracle the others are tested against.
//
// One header per op family (loom/ops/*.h), all included here. Conventions for every op, unless its
// entry says otherwise:
// - All tensors are contiguous, row-major (TensorView::strides are those of a packed
//   tensor). An optional input is passed as a view with data == null.
// - "float" means a storage dtype of f32, bf16 or f16. Kernels convert on load and store
//   and compute in f32; the dtype a kernel is keyed on (KernelDesc::dtype) is that of
//   input [0] unless stated.
// - Outputs named "+=" are accumulated into (parameter gradients, always f32); all other
//   outputs are overwritten.
// - N is a number of rows (tokens, B*T), C a row width (hidden size), V the vocabulary,
//   B batch, T query length, S key length, H query heads, G key/value heads, D head dim.
// - Random numbers (dropout) come from a counter-based Philox4x32-10 stream: element i of a
//   call uses the 4-word block at (key, counter + i / 4), word i % 4, and keeps the element
//   when (word >> 8) * 2^-24 >= p. Every device draws the same mask for the same key.
#pragma once

#include <stdint.h>

#include "loom/ops/attention.h"
#include "loom/ops/elementwise.h"
#include "loom/ops/fp8.h"
#include "loom/ops/gemm.h"
#include "loom/ops/loss.h"
#include "loom/ops/mamba.h"
#include "loom/ops/mla.h"
#include "loom/ops/moe.h"
#include "loom/ops/optim.h"
#include "loom/ops/transformer.h"

namespace loom::ops {

/// Version of the contracts of loom/ops/*.h (KernelDesc::op_version).
inline constexpr int32_t kVersion = 1;

}  // namespace loom::ops
