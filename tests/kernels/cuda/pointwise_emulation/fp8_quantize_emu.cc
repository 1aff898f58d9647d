// Runs fp8_quantize's three kernels (kernels/cuda/pointwise/fp8_quantize_kernel.cuh: the flat
// one, the general transpose and the typed transpose) on the CPU under emulation and compares
// them with the op's definition (loom/ops.h) computed here: Y[i] = loom/cpp/fp8.h's
// f32_to_fp8(x[i] * scale) and Yt its transpose, bit for bit (the conversion is exact by
// definition, and the kernels compute the same f32 product), and amax = the NaN-propagating max
// of |x| folded into the value amax held, exactly. Each case goes through fp8_quantize_plan,
// whose choice the test also checks: the typed kernel for 16-byte aligned X with K a multiple
// of a chunk, Y aligned to a chunk's codes and Yt to 16 bytes with M % 16 == 0; the general
// one otherwise. Cases: f32, bf16 and f16 inputs, E4M3 and E5M2; whole and partial 64 x 64
// tiles; the plan's grid and a 2-block grid (several tiles a block: the typed kernel's loads
// of the next tile while it stores this one); Y absent, amax absent; values that round to
// ties, subnormal codes, overflow (saturation), +-inf and NaN (whose amax is NaN).
#include <gtest/gtest.h>
#include <loom/cpp/fp8.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// A block's __shared__ arrays become statics, which the block's fibers share (blocks run one
// at a time), as norm_emulation does.
#undef __shared__
#define __shared__ static
#include "kernels/cuda/pointwise/fp8_quantize_kernel.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"
#include "tests/kernels/cuda/pointwise_emulation/emu_buf.h"

namespace loom::kernels::cuda::pointwise {
namespace {

using emu_test::Buf;
using emu_test::Codes;
using emu_test::name;
using emu_test::with_type;

struct Case {
  DType x_dtype;
  DType out_dtype;
  int64_t m, k;
  int x_off = 0;      // elements X starts past a 16-byte boundary
  int y_off = 0;      // bytes Y starts past one
  int yt_off = 0;     // bytes Yt starts past one
  bool y = true;      // Y asked for
  bool yt = true;     // Yt asked for
  bool amax = true;   // amax asked for
  unsigned grid = 0;  // 0: the plan's; else this many blocks
  Fp8Kernel want;     // the plan's expected choice
};

std::string describe(const Case& c) {
  return std::string(name(c.x_dtype)) + " -> " + (c.out_dtype == DType::kF8E5M2 ? "e5m2" : "e4m3") +
         " (" + std::to_string(c.m) + ", " + std::to_string(c.k) + ") x_off " +
         std::to_string(c.x_off) + " y_off " + std::to_string(c.y_off) + " yt_off " +
         std::to_string(c.yt_off) + (c.y ? " Y" : "") + (c.yt ? " Yt" : "") +
         (c.amax ? " amax" : "") + " grid " + std::to_string(c.grid);
}

// X's values: uniform in [-2, 2) times 2^e for e in [-12, 12] (E4M3's and E5M2's subnormals,
// normals and, with the scale, overflow), ties of the codes, and a few specials (the last
// of them 25 elements from the end: every case has more).
void fill(Buf& x, std::mt19937& rng, bool specials) {
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::uniform_int_distribution<int> e(-12, 12);
  for (int64_t i = 0; i < x.n; ++i) x.set(i, std::ldexp(u(rng), e(rng)));
  // Ties at scale 1: 1 + 2^-4 lies halfway between E4M3's 1 and 1.125 (and 17 * 2^-10
  // between two of its subnormals); 1 + 2^-3 halfway for E5M2.
  const double ties[] = {1.0625, -1.0625, 17.0 / 1024, 1.125, -1.125, 0.0, -0.0};
  for (int64_t i = 0; i < 7 && 3 * i < x.n; ++i) x.set(3 * i, ties[i]);
  if (!specials) return;
  // -NAN: the host's product keeps its sign, and f32_to_fp8 the sign of a NaN.
  const double sp[] = {INFINITY, -INFINITY, 1e30, -1e30, NAN, -NAN};
  for (int64_t i = 0; i < 6; ++i) x.set(x.n - 1 - 5 * i, sp[i]);
}

void check_case(const Case& c, bool specials, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int64_t n = c.m * c.k;
  Buf x(c.x_dtype, n, c.x_off);
  fill(x, rng, specials);
  const float scale = 0.75f;  // the product rounds: the kernel must multiply in f32 first
  Codes y(n, c.y_off), yt(n, c.yt_off);
  const float amax_before = 0.25f;
  float amax = amax_before;
  const Fp8QuantizePlan p = fp8_quantize_plan(x.p, x.dt, c.y ? y.p : nullptr, c.yt ? yt.p : nullptr,
                                              c.m, c.k, false, 132);
  ASSERT_EQ(static_cast<int>(p.kernel), static_cast<int>(c.want)) << "the plan's kernel";
  const unsigned grid = c.grid != 0 ? c.grid : p.blocks;
  uint8_t* yp = c.y ? y.p : nullptr;
  uint8_t* ytp = c.yt ? yt.p : nullptr;
  float* ap = c.amax ? &amax : nullptr;
  // scale_inv (output [3]) where amax is asked for too, absent elsewhere: either way a case.
  const float scale_inv_before = -7.0f;
  float scale_inv = scale_inv_before;
  float* sp = c.amax ? &scale_inv : nullptr;
  const bool e5m2 = c.out_dtype == DType::kF8E5M2;
  auto run = [&](auto e5) {
    constexpr bool kE5M2 = decltype(e5)::value;
    switch (p.kernel) {
      case Fp8Kernel::kFlat:
        emu::run_grid(grid, kFlatThreads,
                      [&] { quantize_kernel<kE5M2>(x.p, x.dt, &scale, yp, ap, sp, n, p.vec); });
        break;
      case Fp8Kernel::kTranspose:
        emu::run_grid(grid, kFp8TileThreads, [&] {
          quantize_transpose_kernel<kE5M2>(x.p, x.dt, &scale, yp, ytp, ap, sp, c.m, c.k, p.vec,
                                           p.vec_y, p.vec_yt);
        });
        break;
      case Fp8Kernel::kTransposeTyped:
        with_type(x.dt, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          const QuantizeTransposeArgs<T> a{
              reinterpret_cast<const T*>(x.p), &scale, yp, ytp, ap, sp, c.m, c.k};
          emu::run_grid(grid, kFp8TileThreads,
                        [&] { quantize_transpose_typed_kernel<T, kE5M2>(a); });
        });
        break;
    }
  };
  if (e5m2)
    run(std::true_type{});
  else
    run(std::false_type{});

  int64_t bad_y = 0, bad_yt = 0;
  float want_amax = amax_before;
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t col = 0; col < c.k; ++col) {
      const int64_t i = r * c.k + col;
      const float v = static_cast<float>(x.get(i));
      const uint8_t want = f32_to_fp8(v * scale, c.out_dtype);
      const uint8_t got_y = y.p[i], got_yt = yt.p[col * c.m + r];
      if (c.y && got_y != want && bad_y++ < 5)
        ADD_FAILURE() << "Y[" << r << ", " << col << "] = 0x" << std::hex << int{got_y}
                      << ", want 0x" << int{want} << std::dec << " (x = " << v << ")";
      if (c.yt && got_yt != want && bad_yt++ < 5)
        ADD_FAILURE() << "Yt[" << col << ", " << r << "] = 0x" << std::hex << int{got_yt}
                      << ", want 0x" << int{want} << std::dec << " (x = " << v << ")";
      const float a = std::fabs(v);
      if (std::isnan(a) || a > want_amax) want_amax = a;
    }
  EXPECT_EQ(bad_y, 0) << "wrong Y codes";
  EXPECT_EQ(bad_yt, 0) << "wrong Yt codes";
  // Absent outputs stay unwritten; so do the bytes around present ones.
  auto untouched = [](const Codes& b, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i)
      if (b.raw[i] != 0xAB) return false;
    return true;
  };
  const int64_t y0 = y.p - y.raw.data(), yt0 = yt.p - yt.raw.data();
  if (!c.y) {
    EXPECT_TRUE(untouched(y, 0, static_cast<int64_t>(y.raw.size()))) << "Y written";
  }
  if (!c.yt) {
    EXPECT_TRUE(untouched(yt, 0, static_cast<int64_t>(yt.raw.size()))) << "Yt written";
  }
  EXPECT_TRUE(untouched(y, 0, y0) && untouched(y, y0 + n, static_cast<int64_t>(y.raw.size())))
      << "bytes around Y written";
  EXPECT_TRUE(untouched(yt, 0, yt0) && untouched(yt, yt0 + n, static_cast<int64_t>(yt.raw.size())))
      << "bytes around Yt written";
  if (c.amax) {
    if (std::isnan(want_amax))
      EXPECT_TRUE(std::isnan(amax)) << "amax " << amax << ", want NaN";
    else
      EXPECT_EQ(amax, want_amax) << "amax";
  } else {
    EXPECT_EQ(amax, amax_before) << "amax written though absent";
  }
  // fp8_scale_update's scale_inv of the same scale: 1 / scale in f32.
  if (sp != nullptr)
    EXPECT_EQ(scale_inv, 1.0f / scale) << "scale_inv";
  else
    EXPECT_EQ(scale_inv, scale_inv_before) << "scale_inv written though absent";
}

constexpr Fp8Kernel kTyped = Fp8Kernel::kTransposeTyped;
constexpr Fp8Kernel kGeneral = Fp8Kernel::kTranspose;

TEST(Fp8QuantizeEmulation, TypedTransposeEveryDtype) {
  uint64_t seed = 1;
  for (DType xt : {DType::kF32, DType::kBF16, DType::kF16})
    for (DType ot : {DType::kF8E4M3, DType::kF8E5M2}) {
      // Whole tiles; partial tiles (M a multiple of 16, K of 8); several tiles a block.
      check_case({xt, ot, 128, 192, 0, 0, 0, true, true, true, 0, kTyped}, true, seed++);
      check_case({xt, ot, 80, 136, 0, 0, 0, true, true, true, 0, kTyped}, true, seed++);
      check_case({xt, ot, 144, 200, 0, 0, 0, true, true, true, 2, kTyped}, true, seed++);
    }
}

TEST(Fp8QuantizeEmulation, TypedTransposeWithoutYOrAmax) {
  check_case({DType::kBF16, DType::kF8E4M3, 96, 128, 0, 0, 0, false, true, true, 2, kTyped}, true,
             11);
  check_case({DType::kF32, DType::kF8E5M2, 64, 72, 0, 0, 0, true, true, false, 0, kTyped}, false,
             12);
  // Y 8 bytes off 16 for bf16 (a chunk's codes are 8 bytes): still typed.
  check_case({DType::kBF16, DType::kF8E5M2, 64, 64, 0, 8, 0, true, true, true, 0, kTyped}, true,
             13);
}

TEST(Fp8QuantizeEmulation, GeneralTransposeWhereTheTypedCannot) {
  uint64_t seed = 100;
  for (DType xt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // X one element off 16 bytes; K not a multiple of the chunk; M not a multiple of 16;
    // Y 4 bytes off (a bf16 chunk needs 8); Yt off 16 bytes.
    check_case({xt, DType::kF8E4M3, 64, 64, 1, 0, 0, true, true, true, 0, kGeneral}, true, seed++);
    check_case({xt, DType::kF8E5M2, 48, xt == DType::kF32 ? 70 : 68, 0, 0, 0, true, true, true, 2,
                kGeneral},
               true, seed++);
    check_case({xt, DType::kF8E4M3, 37, 64, 0, 0, 0, true, true, true, 0, kGeneral}, true, seed++);
    check_case({xt, DType::kF8E4M3, 64, 64, 0, 0, 4, true, true, true, 0, kGeneral}, false, seed++);
    check_case({xt, DType::kF8E5M2, 37, 50, 1, 1, 3, true, true, true, 2, kGeneral}, true, seed++);
  }
  check_case({DType::kBF16, DType::kF8E4M3, 64, 64, 0, 4, 0, true, true, true, 0, kGeneral}, true,
             200);
}

TEST(Fp8QuantizeEmulation, FlatWithoutYt) {
  uint64_t seed = 300;
  for (DType xt : {DType::kF32, DType::kBF16, DType::kF16}) {
    check_case({xt, DType::kF8E4M3, 33, 70, 0, 0, 0, true, false, true, 0, Fp8Kernel::kFlat}, true,
               seed++);
    check_case({xt, DType::kF8E5M2, 9, 31, 1, 3, 0, true, false, true, 2, Fp8Kernel::kFlat}, true,
               seed++);
  }
}

// The plan alone: the typed kernel's grid is one wave of resident blocks (6 a multiprocessor
// for bf16 / f16, 4 for f32), the general one's at most kFp8MaxBlocks; with an unknown
// multiprocessor count, kFp8MaxBlocks for both.
TEST(Fp8QuantizeEmulation, PlanGrid) {
  Buf x16(DType::kBF16, 64, 0), x32(DType::kF32, 64, 0);
  Codes y(64, 0);
  const int64_t m = 8192, k = 2048;  // 4096 tiles
  EXPECT_EQ(fp8_quantize_plan(x16.p, x16.dt, y.p, y.p, m, k, false, 132).blocks, 132u * 6);
  EXPECT_EQ(fp8_quantize_plan(x32.p, x32.dt, y.p, y.p, m, k, false, 132).blocks, 132u * 4);
  EXPECT_EQ(fp8_quantize_plan(x16.p, x16.dt, y.p, y.p, m, k, false, 0).blocks, 1024u);
  EXPECT_EQ(fp8_quantize_plan(x16.p, x16.dt, y.p, y.p, 128, 128, false, 132).blocks, 4u);
  const Fp8QuantizePlan g = fp8_quantize_plan(x16.p, x16.dt, y.p, y.p, m, k, true, 132);
  EXPECT_EQ(static_cast<int>(g.kernel), static_cast<int>(kGeneral)) << "general forced";
  EXPECT_EQ(g.blocks, 1024u);
}

}  // namespace
}  // namespace loom::kernels::cuda::pointwise
