// Runs rope_fp8_bwd's kernel (kernels/cuda/pointwise/rope_fp8_kernel.cuh: rope_fp8_kernel, vector
// and element by element) on the CPU under emulation and checks the op's contract
// (loom/ops/fp8.h): the bits of rope_bwd's own kernel (rope_kernel.cuh's typed kernel, run here
// under emulation too, on the query and key heads split out of dX and merged back) into dX's
// dtype, then loom/cpp/fp8.h's f32_to_fp8(value * scale) for every code of Y (B T, G (H/G + 2) D)
// and of its transpose, and amax = the NaN-propagating max of |value| folded into the amax held.
// Each case goes through rope_fp8_plan, whose vector / element choice the test checks too.
// Cases: f32, bf16, f16; E4M3 and E5M2; MHA, GQA and one group; whole and partial rotary
// dimensions (and none), up to the table's 128 pairs; positions given (past 2 pi many times) and
// absent; partial 64 x 64 tiles; several tiles a block, over several bands of 64 rows (the
// table refilled within a block's run; it is NaN-poisoned before each block); dX, Y, Yt
// unaligned, D or half not a multiple of a chunk, M not of 16; Y, Yt or amax absent; values past
// E4M3's range, NaN.
#include <gtest/gtest.h>
#include <loom/cpp/fp8.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#undef __shared__
#define __shared__ static
#include "kernels/cuda/pointwise/rope_fp8_kernel.cuh"
#include "kernels/cuda/pointwise/rope_kernel.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"
#include "tests/kernels/cuda/pointwise_emulation/emu_buf.h"
#include "tests/kernels/cuda/pointwise_emulation/emu_codes.h"

namespace loom::kernels::cuda::pointwise {

// The block's dynamic shared memory (rope_fp8_table): NaN-poisoned before each block, so that a
// value read from an entry its band did not fill shows.
alignas(16) float g_table[2 * kFp8Tile * kRopeFp8MaxHalf];
float* rope_fp8_table() { return g_table; }

namespace {

using emu_test::Buf;
using emu_test::Codes;
using emu_test::name;
using emu_test::with_type;

struct Case {
  DType dt, out;
  int64_t b, t, g, per_group, d, rotary;  // per_group: H/G query heads
  bool positions = true;
  int x_off = 0;              // elements past a 16-byte boundary
  int y_off = 0, yt_off = 0;  // bytes past one
  bool y = true, yt = true, amax = true;
  unsigned grid = 0;  // 0: the plan's
  bool want_vec = true;
};

std::string describe(const Case& c) {
  return std::string(name(c.dt)) + (c.out == DType::kF8E5M2 ? " -> e5m2" : " -> e4m3") + " B " +
         std::to_string(c.b) + " T " + std::to_string(c.t) + " G " + std::to_string(c.g) + " H/G " +
         std::to_string(c.per_group) + " D " + std::to_string(c.d) + " rotary " +
         std::to_string(c.rotary) + (c.positions ? " positions" : " no positions") + " offsets x " +
         std::to_string(c.x_off) + " y " + std::to_string(c.y_off) + " yt " +
         std::to_string(c.yt_off) + (c.y ? " Y" : "") + (c.yt ? " Yt" : "") +
         (c.amax ? " amax" : "") + " grid " + std::to_string(c.grid);
}

// rope_bwd's typed kernel, in place, on a packed (B, T, heads, D) tensor.
void rope_bwd_typed(Buf& x, const Case& c, int64_t heads, const int32_t* pos,
                    const float* inv_freq) {
  const int64_t half = c.rotary / 2;
  const RopeStrides st = rope_packed_strides(c.t, heads, c.d);
  const RopePlan rp = rope_plan(x.p, x.dt, x.p, x.dt, c.b * c.t, c.t, heads, c.d, half, st);
  ASSERT_TRUE(rp.typed);
  with_type(x.dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const RopeTypedArgs<T> a =
        rope_typed_args<T>(rp, x.p, pos, inv_freq, x.p, c.t, heads, c.d, half, true, st);
    emu::run_grid(rope_typed_blocks(rp), kFlatThreads, [&] {
      if (rp.width == 1)
        rope_typed_kernel<T, 1>(a);
      else
        rope_typed_kernel<T, kRopeWidth<T>>(a);
    });
  });
}

void check(const Case& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<double> ud(-4.0, 4.0);
  const int64_t heads = c.per_group + 2, width = heads * c.d, m = c.b * c.t, k = c.g * width;
  const int64_t half = c.rotary / 2;
  Buf x(c.dt, m * k, c.x_off);
  for (int64_t i = 0; i < x.n; ++i) x.set(i, ud(rng));
  x.set(k - 1, 3000.0);            // a value head's channel: past E4M3's range with the scale
  x.set((m / 2) * k + 1, 2000.0);  // a query channel, rotated into its partner
  // NaN in channel 1 of head 1 (a key head where H/G = 1) of the last row's group 1 (group 0
  // where there is one), in every other case.
  if (seed % 2 == 1) x.set((m - 1) * k + (c.g > 1 ? width : 0) + c.d + 1, NAN);
  std::vector<int32_t> positions(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i)
    positions[static_cast<size_t>(i)] = static_cast<int32_t>(rng() % 100000);
  const int32_t* pos = c.positions ? positions.data() : nullptr;
  std::vector<float> inv_freq(static_cast<size_t>(half) + 1);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] =
        static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / c.rotary));
  const float scale = 0.75f;  // the product rounds: the kernel must multiply in f32 first

  // The oracle's tensor: dX with its query and key heads split out (packed), turned back by
  // rope_bwd's typed kernel, and merged back.
  Buf r(c.dt, m * k, 0), q(c.dt, m * c.g * c.per_group * c.d, 0), kk(c.dt, m * c.g * c.d, 0);
  for (int64_t i = 0; i < m * k; ++i) r.set(i, x.get(i));
  auto at = [&](int64_t row, int64_t g, int64_t h, int64_t ch) {
    return row * k + g * width + h * c.d + ch;
  };
  for (int64_t row = 0; row < m; ++row)
    for (int64_t g = 0; g < c.g; ++g)
      for (int64_t ch = 0; ch < c.d; ++ch) {
        for (int64_t h = 0; h < c.per_group; ++h)
          q.set(((row * c.g + g) * c.per_group + h) * c.d + ch, x.get(at(row, g, h, ch)));
        kk.set((row * c.g + g) * c.d + ch, x.get(at(row, g, c.per_group, ch)));
      }
  if (half > 0) {
    rope_bwd_typed(q, c, c.g * c.per_group, pos, inv_freq.data());
    rope_bwd_typed(kk, c, c.g, pos, inv_freq.data());
  }
  for (int64_t row = 0; row < m; ++row)
    for (int64_t g = 0; g < c.g; ++g)
      for (int64_t ch = 0; ch < c.d; ++ch) {
        for (int64_t h = 0; h < c.per_group; ++h)
          r.set(at(row, g, h, ch), q.get(((row * c.g + g) * c.per_group + h) * c.d + ch));
        r.set(at(row, g, c.per_group, ch), kk.get((row * c.g + g) * c.d + ch));
      }

  Codes y(m * k, c.y_off), yt(m * k, c.yt_off);
  const float amax_before = 0.25f;
  float amax = amax_before;
  const float scale_inv_before = -7.0f;  // written where amax is asked for, absent elsewhere
  float scale_inv = scale_inv_before;
  uint8_t* yp = c.y ? y.p : nullptr;
  uint8_t* ytp = c.yt ? yt.p : nullptr;
  const RopeFp8Plan p = rope_fp8_plan(x.p, yp, ytp, c.dt, m, k, c.d, half, 132, 233472);
  EXPECT_EQ(p.vec, c.want_vec) << "the plan's vector choice";
  ASSERT_EQ(p.smem, rope_fp8_table_bytes(half));
  ASSERT_LE(p.smem, sizeof(g_table));
  const unsigned grid = c.grid != 0 ? c.grid : p.blocks;
  with_type(c.dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const RopeFp8Args<T> a{reinterpret_cast<const T*>(x.p),
                           pos,
                           inv_freq.data(),
                           &scale,
                           yp,
                           ytp,
                           c.amax ? &amax : nullptr,
                           c.amax ? &scale_inv : nullptr,
                           m,
                           k,
                           static_cast<uint32_t>(c.t),
                           static_cast<uint32_t>(width),
                           static_cast<uint32_t>(c.d),
                           static_cast<uint32_t>(half),
                           static_cast<uint32_t>(heads - 1)};
    auto go = [&](auto vec, auto e5) {
      emu::run_grid(
          dim3(grid), kFp8TileThreads,
          [&] { rope_fp8_kernel<T, decltype(vec)::value, decltype(e5)::value>(a); },
          [] { std::fill(std::begin(g_table), std::end(g_table), std::nanf("")); });
    };
    auto with_e5 = [&](auto vec) {
      if (c.out == DType::kF8E5M2)
        go(vec, std::true_type{});
      else
        go(vec, std::false_type{});
    };
    if (p.vec)
      with_e5(std::true_type{});
    else
      with_e5(std::false_type{});
  });

  int64_t rotated = 0;
  for (int64_t i = 0; i < m * k; ++i)
    rotated += !(static_cast<float>(r.get(i)) == static_cast<float>(x.get(i)));
  if (half > 0) {
    EXPECT_GT(rotated, m * k / 4) << "the oracle turned the query and key heads";
  }
  const int64_t bad = emu_test::expect_quantized(
      m, k, scale, c.out,
      {y, yt, c.y, c.yt, amax, amax_before, c.amax, scale_inv, scale_inv_before},
      [&](int64_t row, int64_t col) { return static_cast<float>(r.get(row * k + col)); });
  std::printf("rope_fp8 %s: %s, %lld codes (%lld rotated), amax %g\n", describe(c).c_str(),
              bad == 0 ? "bit-exact" : "MISMATCH", static_cast<long long>(m * k),
              static_cast<long long>(rotated), amax);
}

TEST(RopeFp8Emulation, VectorKernelEveryDtype) {
  uint64_t seed = 1;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (DType out : {DType::kF8E4M3, DType::kF8E5M2}) {
      // MHA, whole rotary dimension, partial tiles (M = 80, K = 2 * 3 * 16 = 96).
      check({dt, out, 2, 40, 2, 1, 16, 16}, seed++);
      // GQA (two queries a group), half the channels rotated, no positions, two blocks over
      // several tiles (M = 144, K = 2 * 4 * 32 = 256).
      // Blocks 0 and 1 take tiles 0-5 and 6-11 of the 3 x 4: bands 0, 1 and 1, 2.
      Case c{dt, out, 3, 48, 2, 2, 32, 16, false};
      c.grid = 2;
      check(c, seed++);
    }
  // The table's widest rows: D = 256 whole (128 pairs), and 96 of them.
  check({DType::kBF16, DType::kF8E4M3, 1, 64, 1, 1, 256, 256}, 50);
  check({DType::kF32, DType::kF8E5M2, 2, 40, 1, 1, 256, 192}, 51);
}

TEST(RopeFp8Emulation, ElementKernelWhereChunksAreNotWhole) {
  uint64_t seed = 100;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // D and half not multiples of a chunk; one group of three queries; M not a multiple of 16.
    Case c{dt, DType::kF8E4M3, 1, 37, 1, 3, 6, 4};
    c.want_vec = false;
    check(c, seed++);
    // A whole-chunk shape with dX, Y and Yt off their alignment.
    c = Case{dt, DType::kF8E5M2, 2, 32, 2, 1, 16, 16};
    c.x_off = 1, c.y_off = 3, c.yt_off = 5, c.grid = 2, c.want_vec = false;
    check(c, seed++);
  }
  // One block over three bands (M = 140 in one tile column): a new table every tile.
  Case b{DType::kBF16, DType::kF8E4M3, 2, 70, 1, 3, 6, 4};
  b.grid = 1, b.want_vec = false;
  check(b, seed++);
  // f32's chunk is 4: half = 4 is whole there, not in bf16 (8).
  check({DType::kF32, DType::kF8E4M3, 1, 64, 2, 1, 16, 8}, seed++);
  Case c{DType::kBF16, DType::kF8E4M3, 1, 64, 2, 1, 16, 8};
  c.want_vec = false;
  check(c, seed++);
}

TEST(RopeFp8Emulation, NoRotaryChannelsAndAbsentOutputs) {
  // rotary_dim 0: fp8_quantize's codes of dX itself.
  check({DType::kBF16, DType::kF8E5M2, 1, 64, 2, 1, 16, 0}, 200);
  // Only the transpose (the QKV projection's dX is not asked for); no amax; no Yt (M need not
  // be a multiple of 16 then).
  Case c{DType::kBF16, DType::kF8E5M2, 2, 32, 2, 1, 16, 16};
  c.y = false;
  check(c, 201);
  c = Case{DType::kF16, DType::kF8E5M2, 1, 48, 1, 2, 16, 16};
  c.amax = false;
  c.grid = 3;
  check(c, 202);
  c = Case{DType::kF32, DType::kF8E4M3, 1, 33, 2, 1, 16, 16};
  c.yt = false;
  check(c, 203);
}

// The plan's grid: one wave of resident blocks (4 a multiprocessor for bf16 / f16, 3 for f32,
// fewer where their shared memory does not fit, at least 1), fewer where there are fewer tiles;
// at most kFp8MaxBlocks where the device is unknown.
TEST(RopeFp8Emulation, PlanGrid) {
  Buf x(DType::kBF16, 64, 0);
  Codes y(64, 0);
  auto plan = [&](DType dt, int64_t m, int64_t k, int64_t d, int64_t half, int sms, int smem) {
    return rope_fp8_plan(x.p, y.p, y.p, dt, m, k, d, half, sms, smem);
  };
  auto blocks = [&](int64_t m, int64_t k, int64_t d, int64_t half, int sms, int smem) {
    return plan(DType::kBF16, m, k, d, half, sms, smem).blocks;
  };
  // An H100 / H200: 228 KiB a multiprocessor, 38144 bytes a block (a 32 KiB table).
  EXPECT_EQ(blocks(8192, 6144, 128, 64, 132, 233472), 132u * 4);
  EXPECT_EQ(plan(DType::kF32, 8192, 6144, 128, 64, 132, 233472).blocks, 132u * 3);
  EXPECT_EQ(plan(DType::kBF16, 8192, 6144, 128, 64, 132, 233472).smem, 32768u);
  EXPECT_EQ(blocks(128, 64, 16, 8, 132, 233472), 2u);
  EXPECT_EQ(blocks(8192, 6144, 128, 64, 0, 233472), static_cast<unsigned>(kFp8MaxBlocks));
  EXPECT_EQ(blocks(8192, 6144, 128, 64, 132, 0), 132u * 4);  // shared memory unknown
  // 100 KiB a multiprocessor (sm_89): two blocks of a 32 KiB table, one of a 64 KiB one.
  EXPECT_EQ(blocks(8192, 6144, 128, 64, 128, 102400), 128u * 2);
  EXPECT_EQ(blocks(8192, 6144, 256, 128, 128, 102400), 128u);
  EXPECT_EQ(blocks(8192, 6144, 256, 128, 128, 1000), 128u);  // at least one
}

}  // namespace
}  // namespace loom::kernels::cuda::pointwise
