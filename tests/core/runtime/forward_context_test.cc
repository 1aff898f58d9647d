// ForwardContext's memory: release frees an activation once no saved entry refers to it,
// drop_saved lets saved entries go, and the host's CPU figures follow (the oracle is the
// host allocator's own count of bytes in use).
#include "core/runtime/forward_context.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/plugin/host.h"
#include "loom/cpp/tensor.h"

namespace loom::core {
namespace {

using ::testing::HasSubstr;

class ForwardContextMemory : public ::testing::Test {
 protected:
  Host host_{nullptr, 0};
  uint64_t in_use() const { return host_.cpu_memory().current; }
};

TEST_F(ForwardContextMemory, ReleaseFreesAtOnceAndResetFreesTheRest) {
  uint64_t base = in_use();
  ForwardContext ctx(host_, true, RecomputePolicy::kNone, 0, 1, 1);
  TensorView a = allocate(ctx, DType::kF32, {256});  // 1 KiB
  TensorView b = allocate(ctx, DType::kF32, {512});  // 2 KiB
  EXPECT_EQ(ctx.bytes_allocated(), 3072u);
  EXPECT_GE(in_use() - base, 3072u);
  release(ctx, a);
  EXPECT_EQ(ctx.bytes_allocated(), 2048u);
  EXPECT_EQ(ctx.live_blocks(), 1u);
  ctx.reset();
  EXPECT_EQ(ctx.bytes_allocated(), 0u);
  EXPECT_EQ(in_use(), base);
  (void)b;
}

TEST_F(ForwardContextMemory, ASavedTensorLivesUntilItsOwnerDropsIt) {
  ForwardContext ctx(host_, true, RecomputePolicy::kNone, 0, 1, 1);
  int owner = 0, other = 0;
  TensorView x = allocate(ctx, DType::kF32, {4, 64});
  // A view into the middle of the block (a row) locates the same allocation.
  TensorView row = make_view(static_cast<float*>(x.data) + 64, DType::kF32, {64});
  throw_if_error(ctx.save(&owner, 0, &row));
  throw_if_error(ctx.save(&other, 0, &x));
  release(ctx, x);
  EXPECT_EQ(ctx.live_blocks(), 1u);  // two saved entries hold it
  drop_saved(ctx, &owner);
  EXPECT_EQ(ctx.live_blocks(), 1u);
  TensorView back{};
  Status gone = ctx.load(&owner, 0, &back);
  EXPECT_EQ(gone.code, Code::kNotFound);
  take_message(&gone);
  throw_if_error(ctx.load(&other, 0, &back));
  EXPECT_EQ(back.data, x.data);
  drop_saved(ctx, &other);
  EXPECT_EQ(ctx.live_blocks(), 0u);
  EXPECT_EQ(ctx.bytes_allocated(), 0u);
}

TEST_F(ForwardContextMemory, SavingAgainReplacesTheOldReference) {
  ForwardContext ctx(host_, true, RecomputePolicy::kFull, 0, 1, 1);
  int owner = 0;
  TensorView first = allocate(ctx, DType::kF32, {16});
  throw_if_error(ctx.save(&owner, 3, &first));
  release(ctx, first);
  TensorView second = allocate(ctx, DType::kF32, {16});
  throw_if_error(ctx.save(&owner, 3, &second));  // recomputation saves again
  EXPECT_EQ(ctx.live_blocks(), 1u);              // the first one is gone
  release(ctx, second);
  EXPECT_EQ(ctx.live_blocks(), 1u);
  drop_saved(ctx, &owner);
  EXPECT_EQ(ctx.live_blocks(), 0u);
}

TEST_F(ForwardContextMemory, NeverReleasedMemoryOutlivesItsSavesUntilReset) {
  ForwardContext ctx(host_, true, RecomputePolicy::kNone, 0, 1, 1);
  int owner = 0;
  TensorView y = allocate(ctx, DType::kBF16, {8});
  throw_if_error(ctx.save(&owner, 0, &y));
  drop_saved(ctx, &owner);
  EXPECT_EQ(ctx.live_blocks(), 1u);  // its owner never released it: kept until reset
}

TEST_F(ForwardContextMemory, ReleasingTwiceOrForeignMemoryIsRefused) {
  ForwardContext ctx(host_, true, RecomputePolicy::kNone, 0, 1, 1);
  int owner = 0;
  TensorView x = allocate(ctx, DType::kF32, {8});
  throw_if_error(ctx.save(&owner, 0, &x));
  release(ctx, x);
  Status twice = ctx.release(&x);  // still alive through the save, but released once
  EXPECT_EQ(twice.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&twice), HasSubstr("released twice"));
  float parameter[8] = {};
  TensorView p = make_view(parameter, DType::kF32, {8});
  Status foreign = ctx.release(&p);
  EXPECT_EQ(foreign.code, Code::kInvalidArgument);
  take_message(&foreign);
  // Saving memory that is not the context's (a parameter) holds nothing.
  throw_if_error(ctx.save(&owner, 1, &p));
  drop_saved(ctx, &owner);
  EXPECT_EQ(ctx.live_blocks(), 0u);
}

}  // namespace
}  // namespace loom::core
