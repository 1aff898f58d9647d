#include "tests/kernels/device_backend.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace loom::kernels::testing {
namespace {

// Prints, once per binary, which backends run and which are skipped and why.
class BackendReport : public ::testing::Environment {
 public:
  void SetUp() override {
    for (DeviceBackend* b : device_backends()) {
      std::string why;
      if (b->available(&why))
        std::printf("[%s] op kernels compared against cpu.ref on the device\n", b->name());
      else
        std::printf("[%s] skipped: no %s device (%s): the %s kernels are not compared here\n",
                    b->name(), b->name(), why.c_str(), b->name());
    }
    std::fflush(stdout);
  }
};

}  // namespace

std::vector<DeviceBackend*>& device_backends() {
  static std::vector<DeviceBackend*> backends;
  return backends;
}

bool register_device_backend(DeviceBackend* backend) {
  if (device_backends().empty()) ::testing::AddGlobalTestEnvironment(new BackendReport);
  device_backends().push_back(backend);
  return true;
}

}  // namespace loom::kernels::testing
