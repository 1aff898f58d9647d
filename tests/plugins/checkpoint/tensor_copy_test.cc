// Box intersection and the N-d region copy that resharding rests on, against a plain
// element-by-element reference, over random boxes in 1 to 4 dimensions.
#include "plugins/checkpoint/tensor_copy.h"

#include <gtest/gtest.h>
#include <loom/cpp/half.h>

#include <random>
#include <vector>

namespace loom::checkpoint {
namespace {

Box box(std::vector<int64_t> start, std::vector<int64_t> size) {
  Box b;
  b.ndim = static_cast<int32_t>(start.size());
  for (int32_t i = 0; i < b.ndim; ++i) {
    b.start[i] = start[i];
    b.size[i] = size[i];
  }
  return b;
}

TEST(TensorCopy, Intersect) {
  Box o;
  ASSERT_TRUE(intersect(box({0, 4}, {4, 4}), box({2, 0}, {4, 6}), &o));
  EXPECT_EQ(box_text(o), "[2:4, 4:6]");
  EXPECT_FALSE(intersect(box({0}, {4}), box({4}, {2}), &o));  // touching is not overlapping
  EXPECT_TRUE(intersect(box({}, {}), box({}, {}), &o));       // scalars
  EXPECT_EQ(volume(o), 1);
}

TEST(TensorCopy, RandomRegionsMatchReference) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    int32_t ndim = 1 + static_cast<int32_t>(rng() % 4);
    std::vector<int64_t> global(ndim);
    for (auto& g : global) g = 1 + rng() % 6;
    auto random_box = [&] {
      Box b;
      b.ndim = ndim;
      for (int32_t d = 0; d < ndim; ++d) {
        b.start[d] = static_cast<int64_t>(rng() % global[d]);
        b.size[d] = 1 + static_cast<int64_t>(rng() % (global[d] - b.start[d]));
      }
      return b;
    };
    Box a = random_box(), b = random_box(), o;
    if (!intersect(a, b, &o)) continue;
    std::vector<float> src(volume(a)), dst(volume(b), -1.f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
    std::vector<uint16_t> dst16(dst.size(), 0);
    copy_region(contiguous(src.data(), DType::kF32, a.start, a.size, ndim),
                contiguous(dst.data(), DType::kF32, b.start, b.size, ndim), o);
    copy_region(contiguous(src.data(), DType::kF32, a.start, a.size, ndim),
                contiguous(dst16.data(), DType::kBF16, b.start, b.size, ndim), o);
    // Reference: walk every element of b; those inside a carry a's value.
    for (int64_t flat = 0; flat < volume(b); ++flat) {
      int64_t rest = flat, src_flat = 0;
      bool inside = true;
      std::vector<int64_t> g(ndim);
      for (int32_t d = ndim - 1; d >= 0; --d) {
        g[d] = b.start[d] + rest % b.size[d];
        rest /= b.size[d];
      }
      for (int32_t d = 0; d < ndim; ++d) {
        inside = inside && g[d] >= a.start[d] && g[d] < a.start[d] + a.size[d];
        src_flat = src_flat * a.size[d] + (g[d] - a.start[d]);
      }
      float want = inside ? static_cast<float>(src_flat) : -1.f;
      ASSERT_EQ(dst[flat], want) << "trial " << trial << " element " << flat;
      ASSERT_EQ(dst16[flat], inside ? f32_to_bf16(want) : 0) << "trial " << trial;
    }
  }
}

TEST(TensorCopy, StridedSourceAndConversions) {
  // A (3, 2) view of the transpose of a row-major (2, 3) array.
  float m[6] = {0, 1, 2, 3, 4, 5};
  Strided t{m, DType::kF32, 2, {0, 0}, {1, 3}};
  float out[6];
  int64_t zero[2] = {0, 0}, shape[2] = {3, 2};
  copy_region(t, contiguous(out, DType::kF32, zero, shape, 2), box({0, 0}, {3, 2}));
  EXPECT_EQ(std::vector<float>(out, out + 6), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(convertible(DType::kF16, DType::kBF16));
  EXPECT_TRUE(convertible(DType::kI32, DType::kI32));
  EXPECT_FALSE(convertible(DType::kI32, DType::kF32));
  EXPECT_EQ(dtype_from_name("bf16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("nope"), DType::kInvalid);
}

}  // namespace
}  // namespace loom::checkpoint
