// Helpers for kernel libraries that register the same kernel for several dtypes, and the
// cost of a bandwidth-bound op (header-only; nothing here crosses the boundary).
#pragma once

#include <initializer_list>
#include <vector>

#include "loom/kernel.h"
#include "loom/ops.h"

namespace loom {

/// Appends one KernelDesc of `op` per dtype of `dtypes`, each with struct_size filled and
/// the op catalogue's version (ops::kVersion).
/// \param out        the list to append to
/// \param op         op name (static string), e.g. ops::kGemm
/// \param device     device family the kernels run on
/// \param dtypes     the dtypes the kernel serves (the op's keyed dtype)
/// \param name       kernel name (static string), e.g. "cuda"
/// \param priority   highest priority whose `supports` accepts a call wins
/// \param fn, supports, cost, workspace  as in KernelDesc (all but `fn` may be null)
inline void append_kernel_descs(std::vector<KernelDesc>& out, const char* op, DeviceType device,
                                std::initializer_list<DType> dtypes, const char* name,
                                int32_t priority, KernelFn fn, KernelSupportsFn supports,
                                KernelCostFn cost, KernelWorkspaceFn workspace = nullptr) {
  for (DType t : dtypes) {
    KernelDesc k{};
    k.struct_size = sizeof(KernelDesc);
    k.op = op;
    k.op_version = ops::kVersion;
    k.device = device;
    k.dtype = t;
    k.name = name;
    k.priority = priority;
    k.fn = fn;
    k.supports = supports;
    k.cost = cost;
    k.workspace = workspace;
    out.push_back(k);
  }
}

/// The cost of a call that reads every present input and writes every present output once
/// (bandwidth-bound ops), with `flops` floating-point operations.
inline OpCost io_cost(const OpCall* call, double flops) {
  OpCost c{flops, 0.0, 0.0};
  for (int32_t i = 0; i < call->num_inputs; ++i)
    c.bytes_read += static_cast<double>(numel(call->inputs[i])) *
                    static_cast<double>(dtype_size(call->inputs[i].dtype));
  for (int32_t i = 0; i < call->num_outputs; ++i)
    c.bytes_written += static_cast<double>(numel(call->outputs[i])) *
                       static_cast<double>(dtype_size(call->outputs[i].dtype));
  return c;
}

}  // namespace loom
