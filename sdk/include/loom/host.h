// IHost: everything a plugin needs from the core, handed to the plugin's `init`.
//
// Plugins link no loom library: there is one core, one registry and one allocator per
// process, and they are reached only through this interface. The pointer stays valid until
// the plugin's `shutdown` returns.
#pragma once

#include <stdint.h>

#include "loom/kernel.h"
#include "loom/object.h"
#include "loom/status.h"
#include "loom/types.h"

namespace loom {

class ICommunicator;

/// What a process group is for (IHost::group, host 1.2). The core maps every role onto the
/// run's process grid (DESIGN.md section 5): the dimensions tp, cp, ep, dp, pp in Megatron's
/// order (tp varies fastest), and for experts the same ranks seen as etp, ep, edp, pp
/// (Megatron's "parallel folding": attention uses tp x cp x dp, experts etp x ep x edp). A
/// role whose dimensions are all 1 is this rank alone (a size-1 communicator).
enum class ParallelRole : int32_t {
  kWorld = 0,         ///< every rank of the run
  kTensor = 1,        ///< tp: the ranks that split heads, MLP units and the vocabulary
  kContext = 2,       ///< cp: the ranks that split each sequence for attention
  kPipeline = 3,      ///< pp: one rank per pipeline stage (send/recv between stages)
  kData = 4,          ///< cp x ep x dp: the replicas of the dense parameters, whose gradients
                      ///< are averaged here
  kExpert = 5,        ///< ep: the ranks that own different experts (MoE token all-to-all)
  kExpertTensor = 6,  ///< etp: the ranks that split each expert's weights
  kExpertData = 7,    ///< edp: the replicas of the expert parameters, whose gradients are
                      ///< averaged here
  kEmbedding = 8,     ///< the first and last pipeline stage of this rank's pipeline (tied
                      ///< embedding gradients are summed here); this rank alone without pp
  kGradNorm = 9,      ///< the ranks whose gradient pieces make up the whole model's once (the
                      ///< squared gradient norm is summed here)
  kAmax = 10,         ///< the ranks that quantise the same tensors in FP8 (amaxes: max here)
};

/// The role's name for messages ("tensor", "data", ...).
inline const char* parallel_role_name(ParallelRole role) noexcept {
  switch (role) {
    case ParallelRole::kWorld:
      return "world";
    case ParallelRole::kTensor:
      return "tensor";
    case ParallelRole::kContext:
      return "context";
    case ParallelRole::kPipeline:
      return "pipeline";
    case ParallelRole::kData:
      return "data";
    case ParallelRole::kExpert:
      return "expert";
    case ParallelRole::kExpertTensor:
      return "expert-tensor";
    case ParallelRole::kExpertData:
      return "expert-data";
    case ParallelRole::kEmbedding:
      return "embedding";
    case ParallelRole::kGradNorm:
      return "grad-norm";
    case ParallelRole::kAmax:
      return "amax";
  }
  return "unknown";
}

/// Services of the core (host 1.2); methods are only appended: check interface_info().minor
/// before calling a method newer than 1.0.
class IHost {
 public:
  /// Returns kinds::kHost with the version the core implements.
  virtual InterfaceInfo interface_info() const noexcept = 0;

  /// Version string of the running loom ("0.1.0").
  virtual StringView core_version() const noexcept = 0;

  /// Writes one log line through the core's logger.
  /// \param level   severity
  /// \param source  who speaks, e.g. the plugin's name
  /// \param message the text, without a trailing newline
  virtual void log(LogLevel level, StringView source, StringView message) noexcept = 0;

  /// Allocates device memory from the core's allocator (tracked in the memory figures).
  /// \param device     where to allocate
  /// \param bytes      size; 0 gives a null pointer and kOk
  /// \param alignment  power of two, at least 64 is always honoured
  /// \param[out] out   the memory
  virtual Status allocate(Device device, uint64_t bytes, uint64_t alignment,
                          void** out) noexcept = 0;

  /// Returns memory from `allocate` to the core's allocator. Null is a no-op.
  virtual void deallocate(Device device, void* pointer) noexcept = 0;

  /// Resolves the kernel for an op: a spec pin first, then the highest-priority kernel
  /// whose `supports` accepts `example`.
  /// \param op        op name, e.g. "gemm"
  /// \param device    device family
  /// \param dtype     the dtype the op keys on
  /// \param example   a call with the shapes to be used (data may be null), or null
  /// \param[out] out  a copy of the chosen kernel's descriptor
  virtual Status find_kernel(StringView op, DeviceType device, DType dtype, const OpCall* example,
                             KernelDesc* out) noexcept = 0;

  /// Returns the communicator of a process group named by grid dimensions, e.g. "tp",
  /// "dp", "tp,cp" (DESIGN.md section 5). Owned by the core. Prefer `group` (host 1.2),
  /// which names what the group is for, so a plugin does not spell the grid's layout.
  /// \param dims      comma-separated dimension names
  /// \param[out] out  the communicator; a single-process run has only size-1 groups
  virtual Status communicator(StringView dims, ICommunicator** out) noexcept = 0;

  /// The run's base seed (spec /train/seed), for plugins that draw random numbers.
  virtual uint64_t seed() const noexcept = 0;

  // ---- Host 1.1 (ABI 1.2): devices other than the CPU. Check interface_info().minor. ----

  /// Copies `bytes` from `src` on `src_device` to `dst` on `dst_device` (either may be the
  /// CPU; two different non-CPU devices are not supported). Ordered with the work already
  /// issued on the device's compute stream; returns when host memory involved may be read
  /// or reused. Between two CPU buffers it is a memcpy.
  virtual Status copy(Device dst_device, void* dst, Device src_device, const void* src,
                      uint64_t bytes) noexcept = 0;

  /// Sets `bytes` at `pointer` on `device` to zero (on the compute stream for a device).
  virtual Status fill_zero(Device device, void* pointer, uint64_t bytes) noexcept = 0;

  /// The compute stream of `device` (null for the CPU): what OpCall::stream may carry, and
  /// what other streams (a communicator's) order themselves against.
  virtual void* compute_stream(Device device) noexcept = 0;

  /// Waits for all work issued on `device` (a no-op for the CPU) and reports an
  /// asynchronous error of that work.
  virtual Status synchronize(Device device) noexcept = 0;

  // ---- Host 1.2 (ABI 1.5): process groups by role. Check interface_info().minor. ----

  /// The communicator of this rank's group for `role` (see ParallelRole). Owned by the core;
  /// valid until the plugin's shutdown. The first request of a group is collective over
  /// its members (modules are built in the same order on every rank). In a single-process
  /// run every group is this rank alone.
  /// \param role     what the group is for
  /// \param[out] out  the communicator
  virtual Status group(ParallelRole role, ICommunicator** out) noexcept = 0;
};

}  // namespace loom
