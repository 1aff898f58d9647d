// Every op and dtype the CPU library serves has a CUDA kernel too: a model that runs on the
// CPU finds every kernel it resolves when its spec says "device": "cuda". No GPU needed.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/kernel_families.h"

namespace loom::kernels {
namespace {

TEST(CudaCoverageTest, EveryCpuOpAndDtypeHasACudaKernel) {
  std::vector<KernelDesc> cuda;
  cuda::add_all_kernels(cuda);
  std::set<std::pair<std::string, DType>> have;
  for (const KernelDesc& k : cuda) {
    EXPECT_EQ(k.device, DeviceType::kCuda) << k.op;
    EXPECT_EQ(k.struct_size, sizeof(KernelDesc)) << k.op;
    EXPECT_NE(k.fn, nullptr) << k.op;
    EXPECT_NE(k.supports, nullptr) << k.op << ": CUDA kernels must say what they accept";
    have.insert({k.op, k.dtype});
  }
  std::set<std::pair<std::string, DType>> missing;
  for (const KernelDesc& k : cpu::all_kernels())
    if (!have.count({k.op, k.dtype})) missing.insert({k.op, k.dtype});
  for (const auto& [op, dtype] : missing)
    ADD_FAILURE() << "no CUDA kernel for " << op << " (" << dtype_name(dtype) << ")";
}

}  // namespace
}  // namespace loom::kernels
