// The argument checks of comm_backend "nccl" of its own (plugins/comm_nccl/checks.h), on the
// CPU: every refusal is kInvalidArgument with a message naming the operation, the argument and
// the fix. The views point into a host buffer only for their addresses; nothing is
// dereferenced. The checks it shares with comm_gloo (reductions, reduce_scatter / all_gather
// shapes and NCCL's in-place chunk, root, peer, all_to_all slices) are in
// tests/sdk/comm_checks_test.cc.
#include "plugins/comm_nccl/checks.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/cpp/tensor.h"
#include "tests/util/refusal.h"

namespace loom::comm_nccl {
namespace {

using testing::has;
using testing::refusal;

const std::string kWhat = "op on group 'tp/0' (rank 1 of 4)";
constexpr Device kCuda0{DeviceType::kCuda, 0};

class ChecksTest : public ::testing::Test {
 protected:
  // A 1-D CUDA view of `n` elements at element `offset` of the arena (addresses only).
  TensorView at(int64_t offset, int64_t n, DType dtype = DType::kF32, Device device = kCuda0) {
    return make_view(arena_.data() + offset * dtype_size(dtype), dtype, {n}, device);
  }
  std::vector<char> arena_ = std::vector<char>(4096);
};

TEST_F(ChecksTest, CudaTensorPasses) {
  TensorView t = at(0, 8);
  EXPECT_EQ(refusal([&] { check_cuda_tensor(kWhat, "tensor", &t, 0); }), "");
  TensorView empty = make_view(nullptr, DType::kBF16, {0, 3}, kCuda0);
  EXPECT_EQ(refusal([&] { check_cuda_tensor(kWhat, "tensor", &empty, 0); }), "");
}

TEST_F(ChecksTest, CpuTensorIsRefusedPointingAtGloo) {
  TensorView t = at(0, 8, DType::kF32, Device{DeviceType::kCpu, 0});
  const std::string m = refusal([&] { check_cuda_tensor(kWhat, "tensor", &t, 0); });
  EXPECT_TRUE(has(m, kWhat + ": tensor (8) is a CPU tensor")) << m;
  EXPECT_TRUE(has(m, "use comm_backend 'gloo' for CPU tensors")) << m;
}

TEST_F(ChecksTest, TensorOnAnotherDeviceIsRefused) {
  TensorView t = at(0, 8, DType::kF32, Device{DeviceType::kCuda, 1});
  const std::string m = refusal([&] { check_cuda_tensor(kWhat, "input", &t, 0); });
  EXPECT_TRUE(has(m, "input (8) is on cuda:1 but this communicator serves cuda:0")) << m;
}

TEST_F(ChecksTest, NullStridedEmptyAndInvalidAreRefused) {
  EXPECT_TRUE(
      has(refusal([&] { check_cuda_tensor(kWhat, "output", nullptr, 0); }), "output is null"));
  TensorView strided = make_view(arena_.data(), DType::kF32, {4, 2}, kCuda0);
  strided.strides[0] = 4;
  EXPECT_TRUE(has(refusal([&] { check_cuda_tensor(kWhat, "tensor", &strided, 0); }),
                  "(4, 2) is not contiguous"));
  TensorView no_data = make_view(nullptr, DType::kF32, {3}, kCuda0);
  EXPECT_TRUE(
      has(refusal([&] { check_cuda_tensor(kWhat, "tensor", &no_data, 0); }), "has no data"));
  TensorView invalid = at(0, 3);
  invalid.dtype = DType::kInvalid;
  EXPECT_TRUE(has(refusal([&] { check_cuda_tensor(kWhat, "tensor", &invalid, 0); }),
                  "invalid rank or dtype (invalid)"));
  TensorView negative = at(0, 3);
  negative.shape[0] = -3;
  EXPECT_TRUE(
      has(refusal([&] { check_cuda_tensor(kWhat, "tensor", &negative, 0); }), "negative extent"));
}

TEST_F(ChecksTest, AllToAllSlices) {
  TensorView input = at(0, 10), output = at(100, 10);
  const int64_t sc[] = {1, 2, 3, 4}, so[] = {0, 1, 3, 6};
  const int64_t rc[] = {4, 2, 3, 1}, ro[] = {6, 4, 0, 9};  // scattered offsets are fine
  EXPECT_EQ(refusal([&] { check_all_to_all(kWhat, input, sc, so, output, rc, ro, 1, 4); }), "");
  EXPECT_TRUE(
      has(refusal([&] { check_all_to_all(kWhat, input, nullptr, so, output, rc, ro, 1, 4); }),
          "counts and offsets must not be null"));
  const int64_t past_end[] = {0, 1, 3, 7};
  EXPECT_TRUE(
      has(refusal([&] { check_all_to_all(kWhat, input, sc, past_end, output, rc, ro, 1, 4); }),
          "input slice for rank 3 (offset 7, count 4) is outside the (10) tensor of 10 elements"));
  const int64_t self_differs[] = {4, 3, 2, 1};
  EXPECT_TRUE(
      has(refusal([&] { check_all_to_all(kWhat, input, sc, so, output, self_differs, ro, 1, 4); }),
          "send_counts[1] (2) and recv_counts[1] (3) differ"));
  TensorView overlapping = at(5, 10);
  EXPECT_TRUE(
      has(refusal([&] { check_all_to_all(kWhat, input, sc, so, overlapping, rc, ro, 1, 4); }),
          "overlap; NCCL's all-to-all needs disjoint tensors"));
}

}  // namespace
}  // namespace loom::comm_nccl
