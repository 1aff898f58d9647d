// The argument checks of comm_backend "nccl" (plugins/comm_nccl/checks.h), on the CPU: every
// refusal is kInvalidArgument with a message naming the operation, the argument and the fix.
// The views point into a host buffer only for their addresses; nothing is dereferenced.
#include "plugins/comm_nccl/checks.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/cpp/tensor.h"

namespace loom::comm_nccl {
namespace {

const std::string kWhat = "op on group 'tp/0' (rank 1 of 4)";
constexpr Device kCuda0{DeviceType::kCuda, 0};

// The message of the Error `body` throws (with code kInvalidArgument), or "" when none.
template <class Body>
std::string refusal(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

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

TEST_F(ChecksTest, ReductionsFollowGloosRules) {
  for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                  DType::kU8}) {
    EXPECT_TRUE(reducible(d)) << dtype_name(d);
    EXPECT_EQ(refusal([&] { check_reduction(kWhat, d, ReduceOp::kMax); }), "") << dtype_name(d);
  }
  for (DType d : {DType::kI16, DType::kBool, DType::kF8E4M3, DType::kI8})
    EXPECT_TRUE(has(refusal([&] { check_reduction(kWhat, d, ReduceOp::kSum); }),
                    std::string("cannot reduce ") + dtype_name(d)))
        << dtype_name(d);
  EXPECT_EQ(refusal([&] { check_reduction(kWhat, DType::kBF16, ReduceOp::kAvg); }), "");
  EXPECT_TRUE(has(refusal([&] { check_reduction(kWhat, DType::kI32, ReduceOp::kAvg); }),
                  "avg needs a floating-point tensor"));
  EXPECT_TRUE(has(refusal([&] { check_reduction(kWhat, DType::kF32, static_cast<ReduceOp>(9)); }),
                  "unknown reduce op 9"));
}

TEST_F(ChecksTest, ReduceScatterShapesAndInPlace) {
  // 4 ranks, output 3 elements, input 12.
  TensorView input = at(0, 12), output = at(100, 3);
  EXPECT_EQ(refusal([&] { check_reduce_scatter(kWhat, input, output, 1, 4); }), "");
  TensorView chunk = at(3, 3);  // chunk 1 of input: NCCL's in-place form for rank 1
  EXPECT_EQ(refusal([&] { check_reduce_scatter(kWhat, input, chunk, 1, 4); }), "");
  TensorView wrong_chunk = at(6, 3);
  EXPECT_TRUE(has(refusal([&] { check_reduce_scatter(kWhat, input, wrong_chunk, 1, 4); }),
                  "output (3) overlaps input (12) but is not its chunk 1"));
  TensorView short_input = at(0, 11);
  EXPECT_TRUE(has(refusal([&] { check_reduce_scatter(kWhat, short_input, output, 1, 4); }),
                  "input (11) must hold 4 (the group size) times the elements of output (3)"));
  TensorView other_dtype = at(100, 3, DType::kF16);
  EXPECT_TRUE(has(refusal([&] { check_reduce_scatter(kWhat, input, other_dtype, 1, 4); }),
                  "input is f32 (12) but output is f16 (3)"));
}

TEST_F(ChecksTest, AllGatherShapesAndInPlace) {
  TensorView input = at(200, 3), output = at(0, 12);
  EXPECT_EQ(refusal([&] { check_all_gather(kWhat, input, output, 1, 4); }), "");
  TensorView chunk = at(3, 3);
  EXPECT_EQ(refusal([&] { check_all_gather(kWhat, chunk, output, 1, 4); }), "");
  TensorView straddling = at(4, 3);
  EXPECT_TRUE(has(refusal([&] { check_all_gather(kWhat, straddling, output, 1, 4); }),
                  "input (3) overlaps output (12) but is not its chunk 1"));
  TensorView long_output = at(0, 13);
  EXPECT_TRUE(has(refusal([&] { check_all_gather(kWhat, input, long_output, 1, 4); }),
                  "output (13) must hold 4 (the group size) times the elements of input (3)"));
}

TEST_F(ChecksTest, RootAndPeer) {
  EXPECT_EQ(refusal([&] { check_root(kWhat, 3, 4); }), "");
  EXPECT_TRUE(
      has(refusal([&] { check_root(kWhat, 4, 4); }), "root 4 is not a rank of the group (0..3)"));
  EXPECT_EQ(refusal([&] { check_peer(kWhat, 0, 1, 4); }), "");
  EXPECT_TRUE(has(refusal([&] { check_peer(kWhat, 1, 1, 4); }),
                  "peer 1 must be another rank of the group (0..3, not 1)"));
  EXPECT_TRUE(has(refusal([&] { check_peer(kWhat, -1, 1, 4); }), "peer -1"));
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

TEST(Overlaps, ByteRanges) {
  char b[16] = {};
  EXPECT_TRUE(overlaps(b, 8, b + 7, 1));
  EXPECT_FALSE(overlaps(b, 8, b + 8, 8));  // adjacent
  EXPECT_FALSE(overlaps(b + 8, 8, b, 8));
  EXPECT_FALSE(overlaps(b, 0, b, 8));  // nothing to share
  EXPECT_TRUE(overlaps(b + 2, 2, b, 16));
}

}  // namespace
}  // namespace loom::comm_nccl
