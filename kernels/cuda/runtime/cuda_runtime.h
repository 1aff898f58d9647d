// loom's runtime for CUDA devices (loom/device.h): device discovery and properties, one
// caching allocator per device over cudaMalloc / cudaFree, copies, zero fills and the compute
// stream. The CUDA kernels plugin registers `cuda_runtime()` with the registry, and the core
// then serves every "cuda" tensor through it.
//
// Plain C++ (no CUDA types), so the plugin and tests include it without nvcc. It is built
// against the static CUDA runtime: on a machine without a driver or GPU it loads, reports
// device_count() 0 with the runtime's reason, and fails every device call with kUnavailable.
//
// The compute stream of every device is the legacy default stream (a null cudaStream_t):
// it is what kernels launched with no stream use, and it orders itself against every other
// blocking stream, so work issued by code that knows nothing of loom's streams (cuBLAS
// without a stream set, a library's own launches) is still ordered with loom's kernels.
// Nothing here or in the kernels is built with `--default-stream per-thread`, which would
// give a null stream another meaning.
//
// Graphs (device_runtime 1.1). The legacy stream cannot be captured, so a capture runs on a
// stream of its own per device (created on first use, blocking: ordered with the legacy
// stream both ways): while the capturing thread captures, it is that thread's compute
// stream (compute_stream, and the kernels' stream_of for a null OpCall::stream), the
// caching allocator serves a private pool, and host copies and synchronize are refused. A
// replay is launched on the capture stream, so it runs after the legacy stream's earlier
// work and before its later work.
#pragma once

#include <stdint.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/runtime/caching_allocator.h"
#include "loom/device.h"
#include "loom/host.h"

namespace loom::kernels::cuda {

class CudaMemory;

class CudaRuntime final : public IDeviceRuntime {
 public:
  /// Asks the CUDA runtime for the devices and their properties. Never throws or aborts:
  /// a missing driver or device leaves device_count() 0 and the reason in
  /// unavailable_reason().
  CudaRuntime();
  ~CudaRuntime();
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;

  /// Where the warnings about bad frees and failed cudaFree calls go: `host`'s logger, or
  /// stderr while none is set. The kernels plugin sets it in `init` and sets null again in
  /// `shutdown`, after which the IHost is no longer valid.
  void set_log_host(IHost* host) noexcept;

  /// A check run after every successful synchronize: it returns the message of an error
  /// that kernels recorded on the device (and clears it), or "" (then synchronize
  /// succeeds). The kernel library sets it; null (the default) checks nothing.
  using SyncCheck = std::string (*)();
  void set_sync_check(SyncCheck check) noexcept { sync_check_.store(check); }

  // IDeviceRuntime; loom/device.h documents each method. CUDA specifics: errors name the
  // device ("cuda:0") and the failed runtime call with its error name; host-to-device and
  // device-to-host copies wait for the compute stream (see copy in the .cc for why);
  // empty_cache waits for the device before returning memory to the driver.
  InterfaceInfo interface_info() const noexcept override;
  DeviceType device_type() const noexcept override;
  int32_t device_count() const noexcept override;
  StringView unavailable_reason() const noexcept override;
  Status properties(int32_t index, DeviceProperties* out) noexcept override;
  Status allocate(int32_t index, uint64_t bytes, void** out) noexcept override;
  void deallocate(int32_t index, void* pointer) noexcept override;
  Status memory_stats(int32_t index, DeviceMemoryStats* out) noexcept override;
  void reset_peak(int32_t index) noexcept override;
  Status empty_cache(int32_t index) noexcept override;
  Status copy(int32_t index, void* dst, const void* src, uint64_t bytes,
              CopyKind kind) noexcept override;
  Status fill_zero(int32_t index, void* pointer, uint64_t bytes) noexcept override;
  void* compute_stream(int32_t index) noexcept override;
  Status synchronize(int32_t index) noexcept override;
  Status capture_begin(int32_t index) noexcept override;
  Status capture_end(int32_t index, void** graph) noexcept override;
  Status graph_replay(int32_t index, void* graph) noexcept override;
  void graph_destroy(int32_t index, void* graph) noexcept override;

 private:
  std::atomic<SyncCheck> sync_check_{nullptr};
  friend class CudaMemory;  // logs failed cudaFree calls
  struct Device;
  // Device `index`, or throws Error: kUnavailable (naming the reason) without devices,
  // kOutOfRange for an index outside [0, device_count()).
  Device& device(int32_t index, const char* what);
  // Throws kFailedPrecondition naming `what` while device `index` captures a graph (and
  // keeps the message for capture_end).
  void refuse_while_capturing(Device& d, int32_t index, const std::string& what);
  void log_warning(const std::string& message) noexcept;

  std::string unavailable_reason_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::atomic<IHost*> log_host_{nullptr};
};

/// The process-wide CUDA runtime, created on first use and never destroyed (the CUDA
/// runtime may already be torn down when static destructors run, and plugins are never
/// unloaded).
CudaRuntime* cuda_runtime();

/// The dense bf16 throughput NVIDIA states for a device of this name, in FLOP/s, or 0 when
/// the name is not one loom knows ("NVIDIA H100 80GB HBM3" -> 989.4e12).
double peak_bf16_flops_for(const char* device_name);

}  // namespace loom::kernels::cuda
