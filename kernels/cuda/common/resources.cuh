// Per-device and per-stream state shared by the CUDA kernel families (gemm, loss, optim,
// elementwise), created on first use and kept for the life of the process (never freed: a
// CUDA object destroyed after the runtime has shut down, at exit, crashes).
#pragma once

#include <cuda_runtime.h>
#include <loom/types.h>

#include <cstddef>

namespace loom::kernels::cuda {

/// The current CUDA device, on which the kernels launch. Throws Error(kInvalidArgument)
/// naming `op` when `t` lives on another device: the caller must set the device first.
int current_device(const char* op, const TensorView& t);

/// The compute capability of `device` as major * 10 + minor (89 for sm_89, 90 for sm_90),
/// asked of the CUDA runtime once per device; 0 when the runtime cannot tell (no device, no
/// driver, no such ordinal). Never throws.
int compute_capability(int device) noexcept;

/// The multiprocessors of `device`, asked of the CUDA runtime once per device; 0 when the
/// runtime cannot tell. Never throws.
int multiprocessor_count(int device) noexcept;

/// The shared memory of one multiprocessor of `device` in bytes (what its resident blocks
/// share), asked once per device; 0 when the runtime cannot tell.
int shared_memory_per_multiprocessor(int device) noexcept;

/// Lets `kernel` launch with `bytes` of dynamic shared memory a block. Past 48 KiB less the
/// kernel's static shared memory, a kernel must opt in
/// (cudaFuncAttributeMaxDynamicSharedMemorySize); this asks the kernel's current limit
/// (cudaFuncGetAttributes) and raises it where `bytes` is past it, and does nothing for 0 bytes.
/// Call it before every such launch, not once: the attribute belongs to the current device's
/// context, a process may drive several devices, and the calls cost about a microsecond.
/// Throws Error naming `op` when the runtime refuses (more than the device's limit a block).
void allow_dynamic_smem(const void* kernel, size_t bytes, const char* op);
template <class... Args>
void allow_dynamic_smem(void (*kernel)(Args...), size_t bytes, const char* op) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes, op);
}

/// Device memory owned by one (device, stream) pair: cuBLASLt's workspace and the scratch of
/// the ops that run as several kernels (cross_entropy_bwd's mask total, bias_grad's
/// partial sums). Work on one stream runs in order, so the ops on a stream share it
/// safely, and ops on different streams never share it. Allocated by cudaMalloc on the first
/// call for the pair (not inside a CUDA graph capture). A stream destroyed while its work
/// still runs must not be followed by a new stream at the same address that uses these
/// kernels before that work ends.
struct Scratch {
  void* data;
  size_t bytes;
};
inline constexpr size_t kScratchBytes = size_t{32} << 20;
Scratch stream_scratch(int device, cudaStream_t stream);

}  // namespace loom::kernels::cuda
