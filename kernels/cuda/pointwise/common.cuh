// Host-side internals of the pointwise CUDA kernels: the registration function of each op
// file, and the supports / cost hooks every op defines alike.
#pragma once

#include <loom/cpp/error.h>
#include <loom/cpp/op_args.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/common/registration.h"

namespace loom::kernels::cuda::pointwise {

// Largest element count among the call's tensors (the "n" of an elementwise op's cost).
inline int64_t max_numel(const OpCall* call) {
  int64_t n = 0;
  for (int32_t i = 0; i < call->num_inputs; ++i) n = std::max(n, numel(call->inputs[i]));
  for (int32_t i = 0; i < call->num_outputs; ++i) n = std::max(n, numel(call->outputs[i]));
  return n;
}

// Defines NAME_supports (the op's shared checks pass for CUDA tensors, shapes only) and
// NAME_cost (FLOPS_PER_ELEM * max_numel flops, the bytes of every tensor) for an op whose
// checks are `CHECK(const OpCall*, bool shapes_only, DeviceType)` (loom/cpp/op_checks).
#define LOOM_CUDA_HOOKS(NAME, CHECK, FLOPS_PER_ELEM)                           \
  [[maybe_unused]] bool NAME##_supports(const OpCall* c) {                     \
    return check_passes([&] { CHECK(c, true, DeviceType::kCuda); });           \
  }                                                                            \
  [[maybe_unused]] Status NAME##_cost(const OpCall* c, OpCost* out) {          \
    return guard([&] {                                                         \
      CHECK(c, true, DeviceType::kCuda);                                       \
      *out = io_cost(c, (FLOPS_PER_ELEM) * static_cast<double>(max_numel(c))); \
    });                                                                        \
  }

// Each op file appends its KernelDescs (pointwise.cu calls them all).
void add_gelu_kernels(std::vector<KernelDesc>& out);
void add_swiglu_kernels(std::vector<KernelDesc>& out);
void add_dropout_kernels(std::vector<KernelDesc>& out);
void add_embedding_kernels(std::vector<KernelDesc>& out);
void add_layernorm_kernels(std::vector<KernelDesc>& out);
void add_rmsnorm_kernels(std::vector<KernelDesc>& out);
void add_add_norm_kernels(std::vector<KernelDesc>& out);
void add_rope_kernels(std::vector<KernelDesc>& out);
void add_qkv_kernels(std::vector<KernelDesc>& out);
void add_swap_axes_kernels(std::vector<KernelDesc>& out);
void add_softmax_kernels(std::vector<KernelDesc>& out);
void add_fp8_quantize_kernels(std::vector<KernelDesc>& out);
void add_swiglu_fp8_kernels(std::vector<KernelDesc>& out);
void add_rope_fp8_kernels(std::vector<KernelDesc>& out);

// scale_inv[0] = 1 / scale[0] for an FP8 quantising call with nothing to quantise
// (fp8_quantize, swiglu_fp8_fwd / _bwd, rope_fp8_bwd: their optional scale_inv output is written
// even then), by one block of quantize_kernel over no elements on `stream` (a cudaStream_t:
// stream_of the call). Errors name `op`. Defined in fp8_quantize.cu.
void launch_fp8_scale_inv(const float* scale, float* scale_inv, void* stream, const char* op);

}  // namespace loom::kernels::cuda::pointwise
