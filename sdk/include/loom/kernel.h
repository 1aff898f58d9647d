// Op kernels: compute registered by (op, device, dtype).
//
// Every op has one uniform calling convention, so that the registry, the op test harness
// (every kernel against the CPU reference) and the cost model treat all ops alike. What
// is specific to an op (transposes, epsilon, causal flag, ...) travels in `attrs`, a plain
// struct documented next to the op's name in the SDK header that declares the op.
//
// Modules resolve the kernels they need once, when they are built (IHost::find_kernel),
// and call the function pointer after that: resolve once, call many.
#pragma once

#include <stdint.h>

#include "loom/status.h"
#include "loom/types.h"

namespace loom {

/// One invocation of an op.
struct OpCall {
  uint32_t struct_size;      ///< sizeof(OpCall) of the caller; fields are appended
  const TensorView* inputs;  ///< [num_inputs]
  int32_t num_inputs;
  TensorView* outputs;  ///< [num_outputs], memory provided by the caller
  int32_t num_outputs;
  const void* attrs;    ///< op-specific attributes struct, or null
  uint64_t attrs_size;  ///< sizeof(*attrs), checked by the kernel
  void* stream;         ///< device stream (cudaStream_t) or null on the CPU
  void* workspace;      ///< scratch memory from the caller, may be null
  uint64_t workspace_bytes;
};

/// What a call costs, for MFU accounting and the planner (DESIGN.md sections 4 and 12).
struct OpCost {
  double flops;          ///< floating-point operations (a multiply-add counts 2)
  double bytes_read;     ///< bytes read from device memory, ideal
  double bytes_written;  ///< bytes written to device memory, ideal
};

/// Runs the op. Must not throw; reports errors as a Status.
typedef Status (*KernelFn)(const OpCall* call);
/// True when the kernel handles this call (shapes, strides, dtypes, attributes). Looks at
/// shapes only: `data` pointers may be null. Null means "supports every call".
typedef bool (*KernelSupportsFn)(const OpCall* call);
/// Fills the cost of `call`. Null means the op has no cost model.
typedef Status (*KernelCostFn)(const OpCall* call, OpCost* out);
/// Workspace bytes `call` needs. Null means none.
typedef uint64_t (*KernelWorkspaceFn)(const OpCall* call);

/// A kernel as registered with IRegistry::add_kernel.
struct KernelDesc {
  uint32_t struct_size;         ///< sizeof(KernelDesc) of the registering plugin
  const char* op;               ///< op name, e.g. "gemm", "rmsnorm_fwd"; static string
  int32_t op_version;           ///< version of the op's contract (attrs, inputs, outputs)
  DeviceType device;            ///< device family it runs on
  DType dtype;                  ///< dtype it serves (the op defines which tensor it keys on)
  const char* name;             ///< kernel name, unique per op, e.g. "cpu.blas"
  int32_t priority;             ///< highest priority whose `supports` accepts a call wins
  KernelFn fn;                  ///< the kernel
  KernelSupportsFn supports;    ///< may be null
  KernelCostFn cost;            ///< may be null
  KernelWorkspaceFn workspace;  ///< may be null
};

}  // namespace loom
