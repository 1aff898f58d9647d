// The op files of the elementwise family, what each appends to its kernel list (registry.cu),
// and the `supports` / `cost` hooks they share.
#pragma once

#include <loom/cpp/error.h>
#include <loom/cpp/op_args.h>
#include <loom/kernel.h>

#include <vector>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"

namespace loom::kernels::cuda::elementwise {

void add_map_kernels(std::vector<KernelDesc>& out);        // elementwise.cu: add, cast, scale
void add_bias_kernels(std::vector<KernelDesc>& out);       // bias.cu
void add_reduction_kernels(std::vector<KernelDesc>& out);  // reductions.cu

// `supports` of an op whose shared checks are `Check(const OpCall*, bool shapes_only,
// DeviceType)` (loom/cpp/op_checks/elementwise.h): they pass for CUDA tensors, shapes only.
template <auto Check>
bool supports(const OpCall* call) {
  return check_passes([&] { Check(call, true, DeviceType::kCuda); });
}

// `cost` of such an op: kFlops per element of its largest tensor, and the bytes of every
// tensor.
template <auto Check, int kFlops>
Status cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    Check(call, true, DeviceType::kCuda);
    *out = io_cost(call, kFlops * static_cast<double>(max_numel(call)));
  });
}

}  // namespace loom::kernels::cuda::elementwise
