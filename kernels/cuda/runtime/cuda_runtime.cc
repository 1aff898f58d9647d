#include "kernels/cuda/runtime/cuda_runtime.h"

#include <cuda_runtime.h>
#include <loom/cpp/error.h>
#include <loom/kinds.h>
#include <stdio.h>
#include <string.h>

#include <mutex>
#include <string>

#include "kernels/cuda/common/cuda_check.h"

namespace loom::kernels::cuda {
namespace {

std::string device_name(int32_t index) { return "cuda:" + std::to_string(index); }

std::string error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

// Throws Error for a failed runtime call, after clearing the runtime's last error so that a
// later launch_check does not report this failure as its own. A sticky error (the context
// is broken) cannot be cleared and comes back from every later call, each time named.
void check(cudaError_t status, int32_t index, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  Code code = Code::kInternal;
  if (status == cudaErrorMemoryAllocation) code = Code::kResourceExhausted;
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver)
    code = Code::kUnavailable;
  fail(code, device_name(index) + ": " + what + " failed: " + error_text(status));
}

const char* copy_kind_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "host-to-device";
    case CopyKind::kDeviceToHost:
      return "device-to-host";
    case CopyKind::kDeviceToDevice:
      return "device-to-device";
  }
  return "unknown";
}

}  // namespace

// cudaMalloc / cudaFree on one device, as the caching allocator's raw memory.
class CudaMemory final : public RawMemory {
 public:
  CudaMemory(int32_t index, CudaRuntime* runtime) : index_(index), runtime_(runtime) {}

  void* alloc(uint64_t bytes) override {
    check(cudaSetDevice(index_), index_, "cudaSetDevice");
    void* pointer = nullptr;
    // A segment outlives any graph captured meanwhile (its pool keeps it for the graph).
    const cudaError_t status = malloc_outside_graphs(&pointer, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // exhaustion is the cache's to handle; leave no trace for others
      return nullptr;
    }
    check(status, index_, "cudaMalloc");
    return pointer;
  }

  // The block being returned may still be read or written by work enqueued on the compute
  // stream before its owner freed it (single-stream semantics), so the device must be idle
  // before the memory goes back to the driver. cudaFree waits for the device in practice,
  // but the runtime documentation does not promise it: synchronise explicitly (cheap, since
  // this runs only when the cache is emptied).
  void free(void* pointer) noexcept override {
    cudaError_t status = cudaSetDevice(index_);
    if (status == cudaSuccess) status = cudaDeviceSynchronize();
    if (status == cudaSuccess) status = cudaFree(pointer);
    if (status != cudaSuccess) {
      cudaGetLastError();
      runtime_->log_warning(device_name(index_) + ": returning a cached segment to the driver " +
                            "failed: " + error_text(status) + "; the memory may be lost");
    }
  }

 private:
  const int32_t index_;
  CudaRuntime* const runtime_;
};

struct CudaRuntime::Device {
  Device(int32_t index, const DeviceProperties& properties, CudaRuntime* runtime)
      : properties(properties),
        memory(index, runtime),
        allocator(&memory, device_name(index), properties.total_memory) {}

  const DeviceProperties properties;
  CudaMemory memory;  // before the allocator, which returns its segments to it when destroyed
  CachingAllocator allocator;

  // Graph capture (capture_begin .. capture_end), guarded by `capture_mutex`.
  std::mutex capture_mutex;
  cudaStream_t capture_stream = nullptr;  // created at the first capture, never destroyed
  bool capturing = false;
  uint64_t capture_pool = 0;  // the allocator's private pool of the graph being captured
  uint64_t next_pool = 1;     // private pool ids, one per graph
  std::string capture_error;  // the first refusal while capturing
};

// A captured graph: its executable form and the private pool its work uses.
struct CudaGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  uint64_t pool = 0;
};

double peak_bf16_flops_for(const char* device_name) {
  // Dense bf16 tensor-core throughput from NVIDIA's data sheets, by the name the driver
  // reports: the H100 SXM5 says "NVIDIA H100 80GB HBM3", the PCIe card "NVIDIA H100 PCIe";
  // an H200 (and a GH200, the same GPU) says "... H200 ...". NVL parts run at other clocks
  // and power limits and are not in the table.
  struct Entry {
    const char* needs[2];
    double flops;
  };
  static constexpr Entry kTable[] = {
      {{"H100", "PCIe"}, 756e12},
      {{"H100", "HBM3"}, 989.4e12},
      {{"H100", "SXM"}, 989.4e12},
      {{"H200", nullptr}, 989.4e12},
  };
  if (device_name == nullptr) return 0;
  const std::string name(device_name);
  if (name.find("NVL") != std::string::npos) return 0;
  for (const Entry& entry : kTable) {
    bool match = true;
    for (const char* part : entry.needs) {
      if (part != nullptr && name.find(part) == std::string::npos) match = false;
    }
    if (match) return entry.flops;
  }
  return 0;
}

CudaRuntime::CudaRuntime() {
  try {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      unavailable_reason_ = "cudaGetDeviceCount failed: " + error_text(status);
      return;
    }
    if (count <= 0) {
      unavailable_reason_ = "cudaGetDeviceCount: the CUDA runtime reports no devices";
      return;
    }
    for (int index = 0; index < count; ++index) {
      cudaDeviceProp cuda{};
      status = cudaGetDeviceProperties(&cuda, index);
      if (status != cudaSuccess) {
        cudaGetLastError();
        devices_.clear();
        unavailable_reason_ =
            "cudaGetDeviceProperties(" + std::to_string(index) + ") failed: " + error_text(status);
        return;
      }
      DeviceProperties properties{};
      // cudaDeviceProp::name holds 256 bytes; keep what fits, always NUL-terminated.
      const size_t length = strnlen(cuda.name, sizeof properties.name - 1);
      memcpy(properties.name, cuda.name, length);
      properties.name[length] = '\0';
      properties.major = cuda.major;
      properties.minor = cuda.minor;
      properties.multiprocessors = cuda.multiProcessorCount;
      properties.total_memory = cuda.totalGlobalMem;
      properties.peak_bf16_flops = peak_bf16_flops_for(cuda.name);
      devices_.push_back(std::make_unique<Device>(index, properties, this));
    }
  } catch (const std::exception& e) {
    devices_.clear();
    unavailable_reason_ = std::string("setting up the CUDA runtime failed: ") + e.what();
  }
}

CudaRuntime::~CudaRuntime() = default;

void CudaRuntime::set_log_host(IHost* host) noexcept { log_host_.store(host); }

void CudaRuntime::log_warning(const std::string& message) noexcept {
  if (IHost* host = log_host_.load(); host != nullptr) {
    host->log(LogLevel::kWarning, make_string_view("cuda runtime"),
              StringView{message.data(), message.size()});
  } else {
    fprintf(stderr, "[loom cuda runtime] warning: %s\n", message.c_str());
  }
}

CudaRuntime::Device& CudaRuntime::device(int32_t index, const char* what) {
  if (devices_.empty()) {
    fail(Code::kUnavailable,
         std::string(what) + " on " + device_name(index) + ": no CUDA device can be used (" +
             unavailable_reason_ +
             "); run on a machine with an NVIDIA GPU and its driver, or set \"device\": \"cpu\"");
  }
  if (index < 0 || index >= static_cast<int32_t>(devices_.size())) {
    fail(Code::kOutOfRange,
         std::string(what) + " on " + device_name(index) + ": no such device; this process sees " +
             std::to_string(devices_.size()) + " CUDA device(s) (see CUDA_VISIBLE_DEVICES)");
  }
  return *devices_[index];
}

InterfaceInfo CudaRuntime::interface_info() const noexcept { return kinds::kDeviceRuntime; }

DeviceType CudaRuntime::device_type() const noexcept { return DeviceType::kCuda; }

int32_t CudaRuntime::device_count() const noexcept { return static_cast<int32_t>(devices_.size()); }

StringView CudaRuntime::unavailable_reason() const noexcept {
  if (!devices_.empty()) return StringView{nullptr, 0};
  return StringView{unavailable_reason_.data(), unavailable_reason_.size()};
}

Status CudaRuntime::properties(int32_t index, DeviceProperties* out) noexcept {
  return guard([&] {
    if (out == nullptr) fail(Code::kInvalidArgument, "properties: `out` is null");
    *out = device(index, "properties").properties;
  });
}

Status CudaRuntime::allocate(int32_t index, uint64_t bytes, void** out) noexcept {
  return guard([&] {
    if (out == nullptr) fail(Code::kInvalidArgument, "allocate: `out` is null");
    *out = nullptr;
    *out = device(index, "allocate").allocator.allocate(bytes);
  });
}

void CudaRuntime::deallocate(int32_t index, void* pointer) noexcept {
  if (pointer == nullptr) return;
  Status status = guard([&] { device(index, "deallocate").allocator.deallocate(pointer); });
  if (status.code != Code::kOk) log_warning(take_message(&status));
}

Status CudaRuntime::memory_stats(int32_t index, DeviceMemoryStats* out) noexcept {
  return guard([&] {
    if (out == nullptr) fail(Code::kInvalidArgument, "memory_stats: `out` is null");
    *out = device(index, "memory_stats").allocator.stats();
  });
}

void CudaRuntime::reset_peak(int32_t index) noexcept {
  Status status = guard([&] { device(index, "reset_peak").allocator.reset_peak(); });
  if (status.code != Code::kOk) log_warning(take_message(&status));
}

Status CudaRuntime::empty_cache(int32_t index) noexcept {
  return guard([&] { device(index, "empty_cache").allocator.empty_cache(); });
}

// Host memory handed to copy may be pageable (std::vector) or pinned, and the contract is
// that it may be reused (host-to-device) or read (device-to-host) when copy returns. For
// pageable memory cudaMemcpyAsync "might be synchronous" (the CUDA documentation promises
// no more), and for pinned memory it is fully asynchronous, so both directions end with a
// synchronisation of the compute stream. Device-to-device copies stay asynchronous: they
// are ordered with later work on the same stream like any kernel.
Status CudaRuntime::copy(int32_t index, void* dst, const void* src, uint64_t bytes,
                         CopyKind kind) noexcept {
  return guard([&] {
    device(index, "copy");
    cudaMemcpyKind cuda_kind;
    switch (kind) {
      case CopyKind::kHostToDevice:
        cuda_kind = cudaMemcpyHostToDevice;
        break;
      case CopyKind::kDeviceToHost:
        cuda_kind = cudaMemcpyDeviceToHost;
        break;
      case CopyKind::kDeviceToDevice:
        cuda_kind = cudaMemcpyDeviceToDevice;
        break;
      default:
        fail(Code::kInvalidArgument, "copy on " + device_name(index) + ": unknown CopyKind " +
                                         std::to_string(static_cast<int32_t>(kind)));
    }
    if (bytes == 0) return;
    if (dst == nullptr || src == nullptr) {
      fail(Code::kInvalidArgument, "copy on " + device_name(index) + " (" + copy_kind_name(kind) +
                                       ", " + std::to_string(bytes) +
                                       " bytes): null source or destination");
    }
    const std::string what = std::string("cudaMemcpyAsync (") + copy_kind_name(kind) + ", " +
                             std::to_string(bytes) + " bytes)";
    if (kind != CopyKind::kDeviceToDevice)
      refuse_while_capturing(device(index, "copy"), index,
                             std::string("a ") + copy_kind_name(kind) + " copy of " +
                                 std::to_string(bytes) + " bytes");
    check(cudaSetDevice(index), index, "cudaSetDevice");
    cudaStream_t stream = static_cast<cudaStream_t>(compute_stream(index));
    check(cudaMemcpyAsync(dst, src, bytes, cuda_kind, stream), index, what.c_str());
    if (kind != CopyKind::kDeviceToDevice) {
      check(cudaStreamSynchronize(stream), index, (what + ", waiting for it").c_str());
    }
  });
}

Status CudaRuntime::fill_zero(int32_t index, void* pointer, uint64_t bytes) noexcept {
  return guard([&] {
    device(index, "fill_zero");
    if (bytes == 0) return;
    if (pointer == nullptr) {
      fail(Code::kInvalidArgument, "fill_zero on " + device_name(index) + " (" +
                                       std::to_string(bytes) + " bytes): null pointer");
    }
    check(cudaSetDevice(index), index, "cudaSetDevice");
    check(cudaMemsetAsync(pointer, 0, bytes, static_cast<cudaStream_t>(compute_stream(index))),
          index, "cudaMemsetAsync");
  });
}

// The legacy default stream on every device (see the header): a null cudaStream_t; while
// this thread captures a graph, the capture stream.
void* CudaRuntime::compute_stream(int32_t index) noexcept { return t_capture_stream; }

void CudaRuntime::refuse_while_capturing(Device& d, int32_t index, const std::string& what) {
  std::lock_guard<std::mutex> lock(d.capture_mutex);
  if (!d.capturing) return;
  std::string message =
      device_name(index) + ": " + what +
      " while a CUDA graph is being captured: captured work has not run, so the host can "
      "neither read its results nor hand it host memory to read at replay; move it before "
      "or after the capture, or turn graphs off";
  if (d.capture_error.empty()) d.capture_error = message;
  fail(Code::kFailedPrecondition, message);
}

Status CudaRuntime::capture_begin(int32_t index) noexcept {
  return guard([&] {
    Device& d = device(index, "capture_begin");
    std::lock_guard<std::mutex> lock(d.capture_mutex);
    if (d.capturing)
      fail(Code::kFailedPrecondition,
           "capture_begin on " + device_name(index) + ": a graph capture is already under way");
    check(cudaSetDevice(index), index, "cudaSetDevice");
    if (d.capture_stream == nullptr)
      check(cudaStreamCreate(&d.capture_stream), index, "cudaStreamCreate (capture stream)");
    d.capture_pool = d.next_pool++;
    d.allocator.begin_private_pool(d.capture_pool);
    const cudaError_t status =
        cudaStreamBeginCapture(d.capture_stream, cudaStreamCaptureModeThreadLocal);
    if (status != cudaSuccess) {
      d.allocator.end_private_pool();
      d.allocator.release_private_pool(d.capture_pool);
      check(status, index, "cudaStreamBeginCapture");
    }
    d.capturing = true;
    d.capture_error.clear();
    t_capture_stream = d.capture_stream;
  });
}

Status CudaRuntime::capture_end(int32_t index, void** graph) noexcept {
  return guard([&] {
    if (graph == nullptr) fail(Code::kInvalidArgument, "capture_end: `graph` is null");
    *graph = nullptr;
    Device& d = device(index, "capture_end");
    std::unique_lock<std::mutex> lock(d.capture_mutex);
    if (!d.capturing)
      fail(Code::kFailedPrecondition,
           "capture_end on " + device_name(index) + ": no graph capture is under way");
    d.capturing = false;
    t_capture_stream = nullptr;
    d.allocator.end_private_pool();
    auto result = std::make_unique<CudaGraph>();
    result->pool = d.capture_pool;
    cudaError_t status = cudaStreamEndCapture(d.capture_stream, &result->graph);
    std::string error = d.capture_error;
    if (status == cudaSuccess && error.empty())
      status = cudaGraphInstantiate(&result->exec, result->graph, 0);
    if (status != cudaSuccess || !error.empty()) {
      cudaGetLastError();
      if (result->graph != nullptr) cudaGraphDestroy(result->graph);
      // Nothing captured ever runs: the pool's memory goes back to everyone.
      d.allocator.release_private_pool(result->pool);
      if (error.empty())
        error = device_name(index) + ": capturing a CUDA graph failed: " + error_text(status) +
                " (work on the legacy stream or another unsafe call while capturing)";
      fail(Code::kFailedPrecondition, error);
    }
    *graph = result.release();
  });
}

Status CudaRuntime::graph_replay(int32_t index, void* graph) noexcept {
  return guard([&] {
    if (graph == nullptr) fail(Code::kInvalidArgument, "graph_replay: `graph` is null");
    Device& d = device(index, "graph_replay");
    refuse_while_capturing(d, index, "graph_replay");
    check(cudaSetDevice(index), index, "cudaSetDevice");
    check(cudaGraphLaunch(static_cast<CudaGraph*>(graph)->exec, d.capture_stream), index,
          "cudaGraphLaunch");
  });
}

void CudaRuntime::graph_destroy(int32_t index, void* graph) noexcept {
  if (graph == nullptr) return;
  auto* g = static_cast<CudaGraph*>(graph);
  Status status = guard([&] {
    Device& d = device(index, "graph_destroy");
    check(cudaSetDevice(index), index, "cudaSetDevice");
    // The pool's memory may serve others only once replays already issued are done.
    check(cudaStreamSynchronize(d.capture_stream), index, "cudaStreamSynchronize (graph)");
    check(cudaGraphExecDestroy(g->exec), index, "cudaGraphExecDestroy");
    check(cudaGraphDestroy(g->graph), index, "cudaGraphDestroy");
    d.allocator.release_private_pool(g->pool);
  });
  delete g;
  if (status.code != Code::kOk) log_warning(take_message(&status));
}

Status CudaRuntime::synchronize(int32_t index) noexcept {
  return guard([&] {
    refuse_while_capturing(device(index, "synchronize"), index, "synchronize");
    check(cudaSetDevice(index), index, "cudaSetDevice");
    const cudaError_t status = cudaDeviceSynchronize();
    if (status != cudaSuccess) {
      cudaGetLastError();
      fail(Code::kInternal,
           device_name(index) + ": work issued on the device failed: " + error_text(status) +
               " (the error belongs to an earlier kernel or copy; run under compute-sanitizer "
               "or with CUDA_LAUNCH_BLOCKING=1 to find which)");
    }
    // Errors that kernels record on the device instead of failing (e.g. an out-of-range
    // label): reported here, the first synchronising call after them.
    if (SyncCheck check = sync_check_.load()) {
      std::string message = check();
      if (!message.empty()) fail(Code::kOutOfRange, message);
    }
  });
}

CudaRuntime* cuda_runtime() {
  static CudaRuntime* const runtime = new CudaRuntime();
  return runtime;
}

}  // namespace loom::kernels::cuda
