// LossScaler against Megatron's DynamicGradScaler rules worked out by hand: the
// `hysteresis`-th overflow since the scale last grew halves it, and so does each one after it
// (not below the minimum); `window` good steps in a row double it and restore the
// hysteresis; without f16 the scale stays 1.
#include "core/train/loss_scaler.h"

#include <gtest/gtest.h>

namespace loom::core {
namespace {

PrecisionConfig f16(double initial, double min, int64_t window, int64_t hysteresis) {
  PrecisionConfig p;
  p.params = DType::kF16;
  p.initial_loss_scale = initial;
  p.min_loss_scale = min;
  p.loss_scale_window = window;
  p.hysteresis = hysteresis;
  return p;
}

TEST(LossScaler, HalvesAfterHysteresisOverflowsAndDoublesAfterAWindow) {
  LossScaler s(f16(1024, 1, 3, 2));
  ASSERT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);  // first overflow: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);  // second: halved; the hysteresis stays spent
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  s.update(true);  // so the next overflow halves at once, a good step between or not
  EXPECT_EQ(s.scale(), 256);
  s.update(false);
  s.update(false);
  s.update(false);  // three good steps in a row: doubled, hysteresis restored
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);  // third good step in a row: doubled
  EXPECT_EQ(s.scale(), 1024);
  s.update(false);
  s.update(true);  // an overflow resets the good run and spends one hysteresis
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);  // the second overflow since the last growth halves
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScaler, NeverBelowTheMinimumAndItsStateRoundTrips) {
  LossScaler s(f16(4, 2, 1000, 1));
  s.update(true);
  EXPECT_EQ(s.scale(), 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 2);  // the minimum
  s.update(false);
  LossScaler::State state = s.state();
  EXPECT_EQ(state.scale, 2);
  EXPECT_EQ(state.good_steps, 1);
  LossScaler t(f16(65536, 1, 1000, 1));
  t.restore(state);
  EXPECT_EQ(t.scale(), 2);
  EXPECT_EQ(t.state().good_steps, 1);
}

TEST(LossScaler, OtherDtypesKeepAScaleOfOne) {
  PrecisionConfig bf16;
  bf16.params = DType::kBF16;
  LossScaler s(bf16);
  EXPECT_FALSE(s.dynamic());
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 1);
}

}  // namespace
}  // namespace loom::core
