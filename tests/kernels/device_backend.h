// Devices other than the CPU in the op tests (TransformerEngine / ggml test-backend-ops
// style: one harness, every backend against the CPU reference). A backend library (e.g.
// tests/kernels/cuda:cuda_backend) registers itself at load; the op tests that link it then
// run each op on that device too, on the same inputs, against cpu.ref, at the same per-dtype
// tolerance. Where a backend has no device, its comparisons are skipped and the test binary
// says so in one line at start ("[cuda] skipped: ..."), never silently.
#pragma once

#include <loom/kernel.h>

#include <string>
#include <vector>

namespace loom::kernels::testing {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// "cuda": the device family's name, as the skip line prints it.
  virtual const char* name() const = 0;
  /// The family the kernels run on (what the views say).
  virtual DeviceType device_type() const = 0;
  /// True when a device is usable; otherwise `why` says why not.
  virtual bool available(std::string* why) = 0;
  /// The highest-priority kernel of `op` keyed on `key` on this device, or null.
  virtual const KernelDesc* kernel(const char* op, DType key) = 0;
  /// Device memory of `bytes` (null for 0), filled from host memory `from`.
  virtual void* upload(const void* from, size_t bytes) = 0;
  /// Copies device memory to the host, after all work issued so far has finished.
  virtual void download(void* to, const void* from, size_t bytes) = 0;
  /// Scratch device memory of `bytes` (for a kernel's workspace).
  virtual void* scratch(size_t bytes) = 0;
  virtual void release(void* device_memory) = 0;
};

/// Every backend linked into this test binary.
std::vector<DeviceBackend*>& device_backends();

/// Adds a backend (call from a static initialiser); prints its skip line at test start
/// when it has no device.
bool register_device_backend(DeviceBackend* backend);

}  // namespace loom::kernels::testing
