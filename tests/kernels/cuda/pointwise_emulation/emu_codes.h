// The check the fused FP8 emulation tests share (swiglu_fp8_emu.cc, rope_fp8_emu.cc): what a
// quantising kernel wrote (Y (M, K), its transpose Yt, amax, scale_inv) against the oracle's
// values in the input's dtype, by loom/cpp/fp8.h's f32_to_fp8. Compiled with emu_prelude.h
// forced in first, like the kernels.
#pragma once

#include <gtest/gtest.h>
#include <loom/cpp/fp8.h>

#include <cmath>
#include <cstdint>

#include "tests/kernels/cuda/pointwise_emulation/emu_buf.h"

namespace loom::kernels::cuda::pointwise::emu_test {

/// What the kernel was asked for and what it wrote.
struct QuantizedOut {
  const Codes& y;   ///< (M, K), checked when has_y
  const Codes& yt;  ///< (K, M), checked when has_yt
  bool has_y, has_yt;
  float amax;              ///< after the call; amax_before when it was absent
  float amax_before;       ///< what amax held before
  bool has_amax;           ///< amax and scale_inv were passed (the tests pass both or neither)
  float scale_inv;         ///< after the call
  float scale_inv_before;  ///< what it held before
};

/// Expects Y[row, col] and Yt[col, row] = f32_to_fp8(value(row, col) * scale, out) for every
/// element of (m, k), nothing written outside them, amax = the NaN-propagating max of |value|
/// folded into amax_before, and scale_inv = 1 / scale (fp8_scale_update's, in f32); absent
/// outputs untouched. A NaN's sign is whichever operand's NaN the host's arithmetic passed on,
/// which two compilations of one expression need not agree on (a GPU returns its canonical
/// NaN): a NaN code of either sign is the NaN asked for. Returns the wrong codes' count.
template <class Value>
int64_t expect_quantized(int64_t m, int64_t k, float scale, DType out, const QuantizedOut& o,
                         Value value) {
  int64_t bad_y = 0, bad_yt = 0;
  float want_amax = o.amax_before;
  for (int64_t row = 0; row < m; ++row)
    for (int64_t col = 0; col < k; ++col) {
      const float v = value(row, col);
      const uint8_t want = f32_to_fp8(v * scale, out);
      const uint8_t got_y = o.y.p[row * k + col], got_yt = o.yt.p[col * m + row];
      auto same = [&](uint8_t got) {
        return got == want || (std::isnan(v) && std::isnan(fp8_to_f32(got, out)));
      };
      if (o.has_y && !same(got_y) && bad_y++ < 5)
        ADD_FAILURE() << "Y[" << row << ", " << col << "] = 0x" << std::hex << int{got_y}
                      << ", want 0x" << int{want} << std::dec << " (value " << v << ")";
      if (o.has_yt && !same(got_yt) && bad_yt++ < 5)
        ADD_FAILURE() << "Yt[" << col << ", " << row << "] = 0x" << std::hex << int{got_yt}
                      << ", want 0x" << int{want} << std::dec << " (value " << v << ")";
      const float mag = std::fabs(v);
      if (std::isnan(mag) || mag > want_amax) want_amax = mag;
    }
  EXPECT_EQ(bad_y, 0) << "wrong Y codes";
  EXPECT_EQ(bad_yt, 0) << "wrong Yt codes";
  EXPECT_TRUE(o.y.untouched_outside(o.has_y ? m * k : 0)) << "bytes written outside Y";
  EXPECT_TRUE(o.yt.untouched_outside(o.has_yt ? m * k : 0)) << "bytes written outside Yt";
  if (!o.has_amax)
    EXPECT_EQ(o.amax, o.amax_before) << "amax written though absent";
  else if (std::isnan(want_amax))
    EXPECT_TRUE(std::isnan(o.amax)) << "amax " << o.amax << ", want NaN";
  else
    EXPECT_EQ(o.amax, want_amax) << "amax";
  EXPECT_EQ(o.scale_inv, o.has_amax ? 1.0f / scale : o.scale_inv_before) << "scale_inv";
  return bad_y + bad_yt;
}

}  // namespace loom::kernels::cuda::pointwise::emu_test
