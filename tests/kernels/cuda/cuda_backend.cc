// The CUDA backend of the op tests: device memory from loom's CUDA runtime, kernels from
// kernels/cuda (kernel_families.h). Registered at load; without a device (no GPU, no
// driver) it reports the CUDA runtime's reason and the comparisons are skipped visibly.
#include <loom/cpp/error.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda/kernel_families.h"
#include "kernels/cuda/runtime/cuda_runtime.h"
#include "tests/kernels/device_backend.h"

namespace loom::kernels::testing {
namespace {

class CudaBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "cuda"; }
  DeviceType device_type() const override { return DeviceType::kCuda; }
  bool available(std::string* why) override {
    IDeviceRuntime* rt = cuda::cuda_runtime();
    if (rt->device_count() > 0) return true;
    StringView r = rt->unavailable_reason();
    *why = std::string(r.data == nullptr ? "" : r.data, r.size);
    return false;
  }
  const KernelDesc* kernel(const char* op, DType key) override {
    if (kernels_.empty()) cuda::add_all_kernels(kernels_);
    const KernelDesc* best = nullptr;
    for (const KernelDesc& k : kernels_)
      if (std::strcmp(k.op, op) == 0 && k.dtype == key && (!best || k.priority > best->priority))
        best = &k;
    return best;
  }
  void* upload(const void* from, size_t bytes) override {
    void* p = scratch(bytes);
    if (bytes)
      throw_if_error(cuda::cuda_runtime()->copy(0, p, from, bytes, CopyKind::kHostToDevice));
    return p;
  }
  void download(void* to, const void* from, size_t bytes) override {
    throw_if_error(cuda::cuda_runtime()->synchronize(0));
    if (bytes)
      throw_if_error(cuda::cuda_runtime()->copy(0, to, from, bytes, CopyKind::kDeviceToHost));
  }
  void* scratch(size_t bytes) override {
    void* p = nullptr;
    throw_if_error(cuda::cuda_runtime()->allocate(0, bytes, &p));
    return p;
  }
  void release(void* p) override { cuda::cuda_runtime()->deallocate(0, p); }

 private:
  std::vector<KernelDesc> kernels_;
};

CudaBackend g_backend;
const bool g_registered = register_device_backend(&g_backend);

}  // namespace
}  // namespace loom::kernels::testing
