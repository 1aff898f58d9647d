// The communicators' shared argument checks (sdk loom/cpp/comm_checks.h), on the CPU: every
// refusal is kInvalidArgument with a message naming the operation, the argument and the fix,
// and what a backend chooses (its device, which overlaps it takes) is honoured. The views
// point into a host buffer only for their addresses; nothing is dereferenced. comm_nccl's own
// checks are in tests/plugins/comm_nccl/checks_test.cc; comm_gloo's run through the plugin in
// tests/plugins/comm_gloo/errors_test.cc.
#include "loom/cpp/comm_checks.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/util/refusal.h"

namespace loom {
namespace {

using testing::has;
using testing::refusal;

const std::string kWhat = "op on group 'tp/0' (rank 1 of 4)";

// Any device will do.
void any_device(const TensorView&) {}

class CommChecksTest : public ::testing::Test {
 protected:
  // A 1-D view of `n` elements at element `offset` of the arena (addresses only).
  TensorView at(int64_t offset, int64_t n, DType dtype = DType::kF32) {
    return make_view(arena_.data() + offset * dtype_size(dtype), dtype, {n});
  }
  std::vector<char> arena_ = std::vector<char>(4096);
};

TEST_F(CommChecksTest, TensorStructure) {
  TensorView t = at(0, 8);
  EXPECT_EQ(refusal([&] { check_comm_tensor(kWhat, "tensor", &t, any_device); }), "");
  TensorView empty = make_view(nullptr, DType::kBF16, {0, 3});
  EXPECT_EQ(refusal([&] { check_comm_tensor(kWhat, "tensor", &empty, any_device); }), "");
  EXPECT_TRUE(has(refusal([&] { check_comm_tensor(kWhat, "output", nullptr, any_device); }),
                  kWhat + ": output is null"));
  TensorView strided = make_view(arena_.data(), DType::kF32, {4, 2});
  strided.strides[0] = 4;
  EXPECT_TRUE(has(refusal([&] { check_comm_tensor(kWhat, "tensor", &strided, any_device); }),
                  "tensor (4, 2) is not contiguous; pass a contiguous view"));
  TensorView no_data = make_view(nullptr, DType::kF32, {3});
  EXPECT_TRUE(has(refusal([&] { check_comm_tensor(kWhat, "tensor", &no_data, any_device); }),
                  "tensor (3) has no data"));
  TensorView invalid = at(0, 3);
  invalid.dtype = DType::kInvalid;
  EXPECT_TRUE(has(refusal([&] { check_comm_tensor(kWhat, "tensor", &invalid, any_device); }),
                  "invalid rank or dtype (invalid)"));
  TensorView too_many_dims = at(0, 3);
  too_many_dims.ndim = kMaxDims + 1;
  EXPECT_TRUE(has(refusal([&] { check_comm_tensor(kWhat, "tensor", &too_many_dims, any_device); }),
                  "invalid rank or dtype"));
  TensorView negative = at(0, 3);
  negative.shape[0] = -3;
  EXPECT_TRUE(has(refusal([&] { check_comm_tensor(kWhat, "tensor", &negative, any_device); }),
                  "tensor (-3) has a negative extent"));
}

TEST_F(CommChecksTest, DeviceCheckRunsOnceRankAndDtypeAreValid) {
  int calls = 0;
  auto count = [&](const TensorView&) { ++calls; };
  TensorView invalid = at(0, 3);
  invalid.dtype = DType::kInvalid;
  refusal([&] { check_comm_tensor(kWhat, "tensor", &invalid, count); });
  EXPECT_EQ(calls, 0);
  TensorView t = at(0, 3);
  check_comm_tensor(kWhat, "tensor", &t, count);
  EXPECT_EQ(calls, 1);
  // The backend's refusal comes before the layout checks.
  TensorView strided = make_view(arena_.data(), DType::kF32, {4, 2});
  strided.strides[0] = 4;
  const std::string m = refusal([&] {
    check_comm_tensor(kWhat, "tensor", &strided, [&](const TensorView&) {
      fail(Code::kInvalidArgument, kWhat + ": tensor is on the wrong device");
    });
  });
  EXPECT_TRUE(has(m, "wrong device")) << m;
}

TEST_F(CommChecksTest, SameDtype) {
  TensorView f32 = at(0, 12), f16 = at(100, 3, DType::kF16);
  EXPECT_EQ(refusal([&] { check_comm_same_dtype(kWhat, f32, at(50, 3)); }), "");
  EXPECT_TRUE(has(refusal([&] { check_comm_same_dtype(kWhat, f32, f16); }),
                  kWhat + ": input is f32 (12) but output is f16 (3); they must have one dtype"));
}

TEST_F(CommChecksTest, ReductionsAreTheSameOnEveryBackend) {
  for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                  DType::kU8}) {
    EXPECT_TRUE(comm_reducible(d)) << dtype_name(d);
    EXPECT_EQ(refusal([&] { check_comm_reduction(kWhat, d, ReduceOp::kMax, "nccl"); }), "")
        << dtype_name(d);
  }
  for (DType d : {DType::kI16, DType::kBool, DType::kF8E4M3, DType::kI8}) {
    EXPECT_FALSE(comm_reducible(d)) << dtype_name(d);
    EXPECT_TRUE(has(refusal([&] { check_comm_reduction(kWhat, d, ReduceOp::kSum, "nccl"); }),
                    std::string("cannot reduce ") + dtype_name(d)))
        << dtype_name(d);
  }
  EXPECT_TRUE(
      has(refusal([&] { check_comm_reduction(kWhat, DType::kI16, ReduceOp::kSum, "gloo"); }),
          "the gloo backend reduces f32, f64, bf16, f16, i32, i64 and u8"));
  EXPECT_EQ(refusal([&] { check_comm_reduction(kWhat, DType::kBF16, ReduceOp::kAvg, "nccl"); }),
            "");
  EXPECT_TRUE(
      has(refusal([&] { check_comm_reduction(kWhat, DType::kI32, ReduceOp::kAvg, "nccl"); }),
          "avg needs a floating-point tensor"));
  EXPECT_TRUE(has(
      refusal([&] { check_comm_reduction(kWhat, DType::kF32, static_cast<ReduceOp>(9), "nccl"); }),
      "unknown reduce op 9"));
}

TEST_F(CommChecksTest, ReduceScatterShapesAndInPlace) {
  // 4 ranks, output 3 elements, input 12.
  constexpr ChunkOverlap kOwn = ChunkOverlap::kOwnChunk;
  TensorView input = at(0, 12), output = at(100, 3);
  EXPECT_EQ(refusal([&] { check_comm_reduce_scatter(kWhat, input, output, 1, 4, kOwn); }), "");
  TensorView chunk = at(3, 3);  // chunk 1 of input: NCCL's in-place form for rank 1
  EXPECT_EQ(refusal([&] { check_comm_reduce_scatter(kWhat, input, chunk, 1, 4, kOwn); }), "");
  TensorView wrong_chunk = at(6, 3);
  EXPECT_TRUE(
      has(refusal([&] { check_comm_reduce_scatter(kWhat, input, wrong_chunk, 1, 4, kOwn); }),
          "output (3) overlaps input (12) but is not its chunk 1"));
  TensorView short_input = at(0, 11);
  EXPECT_TRUE(
      has(refusal([&] { check_comm_reduce_scatter(kWhat, short_input, output, 1, 4, kOwn); }),
          "input (11) must hold 4 (the group size) times the elements of output (3)"));
  TensorView other_dtype = at(100, 3, DType::kF16);
  EXPECT_TRUE(
      has(refusal([&] { check_comm_reduce_scatter(kWhat, input, other_dtype, 1, 4, kOwn); }),
          "input is f32 (12) but output is f16 (3)"));
  // A backend that takes any overlap still checks the sizes.
  constexpr ChunkOverlap kAny = ChunkOverlap::kAny;
  EXPECT_EQ(refusal([&] { check_comm_reduce_scatter(kWhat, input, wrong_chunk, 1, 4, kAny); }), "");
  EXPECT_TRUE(
      has(refusal([&] { check_comm_reduce_scatter(kWhat, short_input, output, 1, 4, kAny); }),
          "input (11) must hold 4 (the group size)"));
}

TEST_F(CommChecksTest, AllGatherShapesAndInPlace) {
  constexpr ChunkOverlap kOwn = ChunkOverlap::kOwnChunk;
  TensorView input = at(200, 3), output = at(0, 12);
  EXPECT_EQ(refusal([&] { check_comm_all_gather(kWhat, input, output, 1, 4, kOwn); }), "");
  TensorView chunk = at(3, 3);
  EXPECT_EQ(refusal([&] { check_comm_all_gather(kWhat, chunk, output, 1, 4, kOwn); }), "");
  TensorView straddling = at(4, 3);
  EXPECT_TRUE(has(refusal([&] { check_comm_all_gather(kWhat, straddling, output, 1, 4, kOwn); }),
                  "input (3) overlaps output (12) but is not its chunk 1"));
  TensorView long_output = at(0, 13);
  EXPECT_TRUE(has(refusal([&] { check_comm_all_gather(kWhat, input, long_output, 1, 4, kOwn); }),
                  "output (13) must hold 4 (the group size) times the elements of input (3)"));
  constexpr ChunkOverlap kAny = ChunkOverlap::kAny;
  EXPECT_EQ(refusal([&] { check_comm_all_gather(kWhat, straddling, output, 1, 4, kAny); }), "");
  EXPECT_TRUE(has(refusal([&] { check_comm_all_gather(kWhat, input, long_output, 1, 4, kAny); }),
                  "output (13) must hold 4 (the group size)"));
}

TEST_F(CommChecksTest, RootAndPeer) {
  EXPECT_EQ(refusal([&] { check_comm_root(kWhat, 3, 4); }), "");
  EXPECT_TRUE(has(refusal([&] { check_comm_root(kWhat, 4, 4); }),
                  "root 4 is not a rank of the group (0..3)"));
  EXPECT_TRUE(has(refusal([&] { check_comm_root(kWhat, -1, 4); }), "root -1"));
  EXPECT_EQ(refusal([&] { check_comm_peer(kWhat, 0, 1, 4); }), "");
  EXPECT_TRUE(has(refusal([&] { check_comm_peer(kWhat, 1, 1, 4); }),
                  "peer 1 must be another rank of the group (0..3, not 1)"));
  EXPECT_TRUE(has(refusal([&] { check_comm_peer(kWhat, -1, 1, 4); }), "peer -1"));
  EXPECT_TRUE(has(refusal([&] { check_comm_peer(kWhat, 4, 1, 4); }), "peer 4"));
}

TEST_F(CommChecksTest, AllToAllSlices) {
  TensorView input = at(0, 10), output = at(100, 10);
  const int64_t sc[] = {1, 2, 3, 4}, so[] = {0, 1, 3, 6};
  const int64_t rc[] = {4, 2, 3, 1}, ro[] = {6, 4, 0, 9};  // scattered offsets are fine
  auto a2a = [&](const TensorView& in, const int64_t* send_counts, const int64_t* send_offsets,
                 const TensorView& out, const int64_t* recv_counts, const int64_t* recv_offsets) {
    return refusal([&] {
      check_comm_all_to_all(kWhat, in, send_counts, send_offsets, out, recv_counts, recv_offsets, 1,
                            4);
    });
  };
  EXPECT_EQ(a2a(input, sc, so, output, rc, ro), "");
  EXPECT_TRUE(has(a2a(input, nullptr, so, output, rc, ro), "counts and offsets must not be null"));
  EXPECT_TRUE(has(a2a(input, sc, so, output, rc, nullptr), "counts and offsets must not be null"));
  const int64_t past_end[] = {0, 1, 3, 7};
  EXPECT_TRUE(
      has(a2a(input, sc, past_end, output, rc, ro),
          "input slice for rank 3 (offset 7, count 4) is outside the (10) tensor of 10 elements"));
  const int64_t negative[] = {0, 1, -3, 6};
  EXPECT_TRUE(has(a2a(input, sc, so, output, rc, negative), "output slice for rank 2"));
  // Offsets and counts whose sum would overflow are outside too.
  const int64_t huge_counts[] = {1, 2, 3, INT64_MAX}, huge_offsets[] = {0, 1, 3, 8};
  EXPECT_TRUE(has(a2a(input, huge_counts, huge_offsets, output, rc, ro), "input slice for rank 3"));
  const int64_t self_differs[] = {4, 3, 2, 1};
  EXPECT_TRUE(has(a2a(input, sc, so, output, self_differs, ro),
                  "send_counts[1] (2) and recv_counts[1] (3) differ"));
  TensorView other_dtype = at(100, 10, DType::kI32);
  EXPECT_TRUE(has(a2a(input, sc, so, other_dtype, rc, ro), "they must have one dtype"));
  // Overlapping tensors are the backend's business (comm_nccl refuses them, comm_gloo not).
  TensorView overlapping = at(5, 10);
  EXPECT_EQ(a2a(input, sc, so, overlapping, rc, ro), "");
}

TEST(BytesOverlap, ByteRanges) {
  char b[16] = {};
  EXPECT_TRUE(bytes_overlap(b, 8, b + 7, 1));
  EXPECT_FALSE(bytes_overlap(b, 8, b + 8, 8));  // adjacent
  EXPECT_FALSE(bytes_overlap(b + 8, 8, b, 8));
  EXPECT_FALSE(bytes_overlap(b, 0, b, 8));  // nothing to share
  EXPECT_FALSE(bytes_overlap(nullptr, 8, b, 8));
  EXPECT_TRUE(bytes_overlap(b + 2, 2, b, 16));
}

}  // namespace
}  // namespace loom
