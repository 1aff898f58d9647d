// Every op and dtype the CPU library serves has a CUDA kernel too: a model that runs on the
// CPU finds every kernel it resolves when its spec says "device": "cuda". No GPU needed.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
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

// The registry refuses two kernels of one (op, device, dtype) at one priority (the choice
// would be undefined) and then fails the whole plugin's load: the library's own list must
// not hold such a pair, nor two of one name.
TEST(CudaCoverageTest, NoTwoKernelsShareAPriorityOrAName) {
  std::vector<KernelDesc> cuda;
  cuda::add_all_kernels(cuda);
  std::set<std::tuple<std::string, DType, int32_t>> priorities;
  std::set<std::tuple<std::string, DType, std::string>> names;
  for (const KernelDesc& k : cuda) {
    EXPECT_TRUE(priorities.insert({k.op, k.dtype, k.priority}).second)
        << k.op << " (" << dtype_name(k.dtype) << ") has two kernels at priority " << k.priority
        << ", one of them " << k.name;
    EXPECT_TRUE(names.insert({k.op, k.dtype, k.name}).second)
        << k.op << " (" << dtype_name(k.dtype) << ") has two kernels named " << k.name;
  }
}

}  // namespace
}  // namespace loom::kernels
