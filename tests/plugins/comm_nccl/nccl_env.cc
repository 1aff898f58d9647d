#include "tests/plugins/comm_nccl/nccl_env.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "core/plugin/plugin_manager.h"
#include "loom/kinds.h"

namespace loom::testing {
namespace fs = std::filesystem;

namespace {
core::PluginManager& nccl_plugins() {
  static core::PluginManager* manager = [] {
    std::vector<core::SearchRoot> roots{{fs::absolute("plugins/comm_nccl"), "test"}};
    auto* m = new core::PluginManager(core::Catalog(roots));  // lives until exit
    m->load("comm_nccl");
    return m;
  }();
  return *manager;
}
}  // namespace

ObjectPtr make_nccl_backend(const nlohmann::json& node) {
  static std::mutex mutex;  // the plugin manager is not made for concurrent builds
  std::lock_guard<std::mutex> lock(mutex);
  return core::build_component(nccl_plugins(), node, kinds::kCommBackend, "/parallel/comm_backend");
}

int cuda_devices(std::string* reason) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(error);
    return 0;
  }
  if (count == 0) *reason = "cudaGetDeviceCount found no device";
  return count;
}

bool cuda_ok(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return true;
  ADD_FAILURE() << call << ": " << cudaGetErrorName(error) << ": " << cudaGetErrorString(error);
  return false;
}

DeviceTensor::DeviceTensor(DType dtype, size_t n) : dtype_(dtype), n_(n) {
  cuda_ok(cudaGetDevice(&device_), "cudaGetDevice");
  // At least one byte, so that an empty tensor still has an address of its own.
  cuda_ok(cudaMalloc(&data_, std::max<size_t>(n * dtype_size(dtype), 1)), "cudaMalloc");
}

DeviceTensor::~DeviceTensor() { (void)cudaFree(data_); }

TensorView DeviceTensor::view(size_t offset, size_t count) const {
  int64_t shape = static_cast<int64_t>(count);
  return make_view(static_cast<char*>(data_) + offset * dtype_size(dtype_), dtype_, &shape, 1,
                   Device{DeviceType::kCuda, device_});
}

void DeviceTensor::upload(const HostTensor& host) {
  EXPECT_EQ(host.dtype, dtype_);
  EXPECT_EQ(host.n, n_);
  // The device synchronisation orders the copy before work on any stream, the compute
  // stream the communicator orders itself after included.
  cuda_ok(cudaMemcpy(data_, host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

HostTensor DeviceTensor::download() const {
  HostTensor host(dtype_, n_);
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_ok(cudaMemcpy(host.bytes.data(), data_, host.bytes.size(), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  return host;
}

}  // namespace loom::testing
