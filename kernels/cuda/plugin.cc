// The `kernels_cuda` plugin: registers loom's CUDA device runtime (memory, copies, the
// compute stream; kernels/cuda/runtime) and every CUDA kernel family with the core.
//
// On a machine without a GPU or driver the plugin still loads and registers: the runtime
// then reports no device with the CUDA runtime's reason, and a spec with "device": "cuda"
// stops before anything is built with that reason (Host::check_device), never a crash.
#include <loom/sdk.h>

#include <vector>

#include "kernels/cuda/kernel_families.h"
#include "kernels/cuda/runtime/cuda_runtime.h"

namespace {

class KernelsCuda final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    loom::kernels::cuda::CudaRuntime* runtime = loom::kernels::cuda::cuda_runtime();
    runtime->set_log_host(&host());
    runtime->set_sync_check(&loom::kernels::cuda::take_recorded_error);
    r.device_runtime(runtime);
    if (runtime->device_count() == 0) {
      loom::StringView why = runtime->unavailable_reason();
      log(loom::LogLevel::kDebug,
          "no CUDA device (" + std::string(why.data == nullptr ? "" : why.data, why.size) +
              "): kernels registered, but a cuda run will stop before start");
    }
    std::vector<loom::KernelDesc> kernels;
    loom::kernels::cuda::add_all_kernels(kernels);
    for (const loom::KernelDesc& k : kernels) r.kernel(k);
  }
  void shutdown() override {
    loom::kernels::cuda::cuda_runtime()->set_sync_check(nullptr);
    loom::kernels::cuda::cuda_runtime()->set_log_host(nullptr);
  }
};

}  // namespace

LOOM_PLUGIN(KernelsCuda)
