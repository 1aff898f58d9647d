// IDeviceRuntime: what a kernel library gives the core for a device family other than the
// CPU (memory, copies, the compute stream, properties), so that "device": "cuda" in a spec
// changes where tensors live and which kernels run, and nothing above the kernels.
//
// A kernel library registers one runtime per device family (IRegistry::add_device_runtime,
// ABI 1.2). The core then routes IHost::allocate / deallocate / copy / fill_zero for that
// family to it and reports its memory figures next to the CPU's. Plugins never call a
// runtime directly: they go through IHost, so there stays one allocator per process.
//
// Streams: every device has one compute stream, the one `compute_stream` returns. Kernels
// run on the stream their OpCall names; a null OpCall::stream means that compute stream.
// Memory handed out by `allocate` may be reused as soon as it is deallocated by work later
// on the compute stream, so work on any other stream (a communicator's) must be ordered
// against the compute stream by whoever issues it.
#pragma once

#include <stdint.h>

#include "loom/status.h"
#include "loom/types.h"

namespace loom {

/// Memory figures of one device, in bytes.
struct DeviceMemoryStats {
  uint64_t allocated;          ///< held by live allocations (rounded sizes)
  uint64_t peak_allocated;     ///< highest `allocated` since start or reset_peak
  uint64_t reserved;           ///< obtained from the driver: allocated plus cached free blocks
  uint64_t peak_reserved;      ///< highest `reserved` since start or reset_peak
  uint64_t total;              ///< the device's capacity, 0 when unknown
  uint64_t num_allocs;         ///< allocations served since start
  uint64_t num_driver_allocs;  ///< of which went to the driver (cache misses)
  uint64_t num_cache_flushes;  ///< times the cache was emptied to satisfy a request
};

/// What a device is.
struct DeviceProperties {
  char name[96];            ///< e.g. "NVIDIA H100 80GB HBM3", NUL-terminated
  int32_t major;            ///< compute capability major (9 on Hopper), 0 if none
  int32_t minor;            ///< compute capability minor
  int32_t multiprocessors;  ///< streaming multiprocessors (or cores)
  uint64_t total_memory;    ///< bytes
  double peak_bf16_flops;   ///< dense bf16 tensor throughput the vendor states, 0 if unknown
};

/// Direction of a copy.
enum class CopyKind : int32_t {
  kHostToDevice = 1,
  kDeviceToHost = 2,
  kDeviceToDevice = 3,
};

/// A device family's runtime. Version 1.1 (kinds::kDeviceRuntime); methods are only
/// appended, and the core calls a 1.1 method only on a runtime whose interface_info() says
/// 1.1. Every method may be called from any thread, except where a graph capture says
/// otherwise.
class IDeviceRuntime {
 public:
  /// kinds::kDeviceRuntime.
  virtual InterfaceInfo interface_info() const noexcept = 0;

  /// The family this runtime serves (never kCpu).
  virtual DeviceType device_type() const noexcept = 0;

  /// Number of devices of this family the process can use (0 when none: the library then
  /// explains why in `unavailable_reason`).
  virtual int32_t device_count() const noexcept = 0;

  /// Why no device can be used ("cudaGetDeviceCount: no CUDA-capable device is detected"),
  /// or an empty view when device_count() > 0. Valid as long as the runtime.
  virtual StringView unavailable_reason() const noexcept = 0;

  /// Describes device `index` (0 <= index < device_count()).
  virtual Status properties(int32_t index, DeviceProperties* out) noexcept = 0;

  /// Allocates `bytes` on device `index`, aligned to at least 256 bytes. The runtime may
  /// serve it from a cache of freed blocks; on exhaustion it empties its cache and tries
  /// once more before failing with kResourceExhausted (the message gives the figures).
  /// \param index     the device ordinal
  /// \param bytes     size; 0 gives a null pointer and kOk
  /// \param[out] out  device memory, usable by work on the compute stream
  virtual Status allocate(int32_t index, uint64_t bytes, void** out) noexcept = 0;

  /// Returns memory from `allocate`. Null is a no-op; an unknown pointer is logged, not
  /// freed.
  virtual void deallocate(int32_t index, void* pointer) noexcept = 0;

  /// Current and peak memory of device `index`.
  virtual Status memory_stats(int32_t index, DeviceMemoryStats* out) noexcept = 0;

  /// Sets the peaks of device `index` to the current figures (for per-phase peaks).
  virtual void reset_peak(int32_t index) noexcept = 0;

  /// Returns the cached free blocks of device `index` to the driver.
  virtual Status empty_cache(int32_t index) noexcept = 0;

  /// Copies `bytes` between host and device memory, or within a device, in order with the
  /// work already issued on device `index`'s compute stream. Returns when the host memory
  /// involved may be reused (kHostToDevice) or read (kDeviceToHost); a device-to-device
  /// copy may still be in flight on the compute stream.
  virtual Status copy(int32_t index, void* dst, const void* src, uint64_t bytes,
                      CopyKind kind) noexcept = 0;

  /// Sets `bytes` of device memory to zero, on the compute stream.
  virtual Status fill_zero(int32_t index, void* pointer, uint64_t bytes) noexcept = 0;

  /// The compute stream of device `index` (a cudaStream_t on CUDA), for OpCall::stream and
  /// for ordering other streams against it.
  virtual void* compute_stream(int32_t index) noexcept = 0;

  /// Waits until all work issued on device `index` has finished; reports an asynchronous
  /// error of that work (an illegal address, a kernel that failed) with its name.
  virtual Status synchronize(int32_t index) noexcept = 0;

  // ---- 1.1: graphs of the compute stream's work (CUDA graphs) ----
  //
  // A graph records the work issued on a device's compute stream between capture_begin and
  // capture_end, and replays all of it with one call, at a fraction of the host's cost of
  // issuing it. The rules a capture follows are those of CUDA stream capture:
  //   - Work issued while capturing is recorded, not run: nothing it computes exists until
  //     the graph is replayed, and every replay reads and writes the same addresses with the
  //     same arguments (a value the host passes, such as a learning rate, is frozen).
  //   - `allocate` serves from a memory pool private to the graph: what the captured work
  //     allocates and frees stays the graph's, even after it is deallocated, until
  //     graph_destroy; the rest of the process never gets those addresses meanwhile.
  //   - `copy` between host and device memory and `synchronize` fail (kFailedPrecondition,
  //     naming the capture): the host cannot read what has not run, and a replay cannot
  //     read host memory that may have changed. Device-to-device copies and fill_zero are
  //     recorded.
  //   - Only the thread that began the capture issues work until capture_end.
  // A failed capture still ends with capture_end, which then returns the error (the first
  // one met while capturing, or the driver's) and no graph. A runtime whose device cannot
  // capture graphs fails capture_begin with kUnimplemented saying so (and capture_end with
  // kFailedPrecondition, graph_replay with kInvalidArgument; graph_destroy of null is a
  // no-op); the core then names /train/cuda_graph in its message.

  /// Starts recording the work issued on device `index`'s compute stream; allocations from
  /// now until capture_end come from a new private pool. Fails with kFailedPrecondition when
  /// a capture is already under way on that device.
  virtual Status capture_begin(int32_t index) noexcept = 0;

  /// Ends the capture of device `index` and makes a replayable graph of it.
  /// \param index      the device ordinal
  /// \param[out] graph the graph (opaque; give it to graph_replay and graph_destroy), or
  ///                   null when the capture failed (the returned status says why)
  virtual Status capture_end(int32_t index, void** graph) noexcept = 0;

  /// Issues all of `graph`'s work on device `index`'s compute stream, in order with the work
  /// already issued there (asynchronous, as a kernel launch is).
  virtual Status graph_replay(int32_t index, void* graph) noexcept = 0;

  /// Frees `graph` and hands its private pool back to the device's allocator, once work
  /// already issued has finished with it. Null is a no-op.
  virtual void graph_destroy(int32_t index, void* graph) noexcept = 0;

 protected:
  ~IDeviceRuntime() = default;
};

}  // namespace loom
