// Runs swiglu_fp8_fwd's and swiglu_fp8_bwd's kernels (kernels/cuda/pointwise/
// fp8_quantize_kernel.cuh: swiglu_fp8_kernel, vector and element by element) on the CPU under
// emulation and checks the ops' contract (loom/ops/fp8.h): the bits of swiglu's own kernel
// (swiglu_kernel.cuh's typed kernel, run here under emulation too) into X's dtype, then
// loom/cpp/fp8.h's f32_to_fp8(value * scale) for every code of Y (forward (N, F), backward (N, 2F))
// and of its transpose, and amax = the NaN-propagating max of |value| folded into the value amax
// held. Each case goes through swiglu_fp8_plan, whose vector / element choice the test checks too.
// Cases: f32, bf16, f16; E4M3 and E5M2; whole and partial 64 x 64 tiles; several tiles a
// block; unaligned X, dY, Y, Yt, F not a multiple of a chunk, N not of 16; Y, Yt or amax
// absent; gates that saturate sigmoid, products past E4M3's range, NaN.
#include <gtest/gtest.h>
#include <loom/cpp/fp8.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#undef __shared__
#define __shared__ static
#include "kernels/cuda/pointwise/fp8_quantize_kernel.cuh"
#include "kernels/cuda/pointwise/swiglu_kernel.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"
#include "tests/kernels/cuda/pointwise_emulation/emu_buf.h"
#include "tests/kernels/cuda/pointwise_emulation/emu_codes.h"

namespace loom::kernels::cuda::pointwise {
namespace {

using emu_test::Buf;
using emu_test::Codes;
using emu_test::name;
using emu_test::with_type;

struct Case {
  bool bwd;
  DType dt, out;
  int64_t n, f;
  int x_off = 0, dy_off = 0;  // elements past a 16-byte boundary
  int y_off = 0, yt_off = 0;  // bytes past one
  bool y = true, yt = true, amax = true;
  unsigned grid = 0;  // 0: the plan's
  bool want_vec = true;
};

std::string describe(const Case& c) {
  return std::string(c.bwd ? "bwd " : "fwd ") + name(c.dt) +
         (c.out == DType::kF8E5M2 ? " -> e5m2" : " -> e4m3") + " N " + std::to_string(c.n) + " F " +
         std::to_string(c.f) + " offsets x " + std::to_string(c.x_off) + " dy " +
         std::to_string(c.dy_off) + " y " + std::to_string(c.y_off) + " yt " +
         std::to_string(c.yt_off) + (c.y ? " Y" : "") + (c.yt ? " Yt" : "") +
         (c.amax ? " amax" : "") + " grid " + std::to_string(c.grid);
}

void check(const Case& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<double> ud(-6.0, 6.0);
  Buf x(c.dt, c.n * 2 * c.f, c.x_off), dy(c.dt, c.n * c.f, c.dy_off);
  for (int64_t i = 0; i < x.n; ++i) x.set(i, ud(rng));
  for (int64_t i = 0; i < dy.n; ++i) dy.set(i, ud(rng) * 40);  // dX past E4M3's 448 at times
  // Sigmoid's limits, an up projection that overflows E4M3 with the scale, and a NaN gate.
  const double gates[] = {-100, -20, 20, 100, 30};
  for (int k = 0; k < 5 && k < c.f; ++k) x.set((k % c.n) * 2 * c.f + (k * 7) % c.f, gates[k]);
  x.set((c.n - 1) * 2 * c.f + c.f + c.f - 1, 3000.0);  // up of the last element
  x.set((c.n / 2) * 2 * c.f + c.f / 2, NAN);
  const float scale = 0.75f;  // the product rounds: the kernel must multiply in f32 first

  // The oracle's tensor: swiglu's kernel into X's dtype (the typed one, element by element;
  // emu_main.cc checks that its vector form and the general kernel give the same bits).
  const int64_t k = c.bwd ? 2 * c.f : c.f;
  Buf r(c.dt, c.n * k, 0);
  const void* dy_in = c.bwd ? static_cast<const void*>(dy.p) : nullptr;
  const SwigluPlan sp = swiglu_plan(x.p, x.dt, dy_in, dy.dt, r.p, r.dt, c.n, c.f);
  ASSERT_TRUE(sp.typed);
  with_type(c.dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const SwigluTypedArgs<T> a = swiglu_typed_args<T>(sp, x.p, dy_in, r.p, c.f);
    emu::run_grid(swiglu_typed_blocks(sp), kFlatThreads, [&] { swiglu_typed_kernel<T, false>(a); });
  });

  Codes y(c.n * k, c.y_off), yt(c.n * k, c.yt_off);
  const float amax_before = 0.25f;
  float amax = amax_before;
  // scale_inv (output [3]) where amax is asked for too, absent elsewhere.
  const float scale_inv_before = -7.0f;
  float scale_inv = scale_inv_before;
  uint8_t* yp = c.y ? y.p : nullptr;
  uint8_t* ytp = c.yt ? yt.p : nullptr;
  const void* dyp = c.bwd ? static_cast<const void*>(dy.p) : nullptr;
  const SwigluFp8Plan p = swiglu_fp8_plan(x.p, dyp, yp, ytp, c.dt, c.n, c.f, 132);
  EXPECT_EQ(p.vec, c.want_vec) << "the plan's vector choice";
  const unsigned grid = c.grid != 0 ? c.grid : p.blocks;
  with_type(c.dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const SwigluFp8Args<T> a{
        reinterpret_cast<const T*>(x.p), reinterpret_cast<const T*>(dyp), &scale, yp, ytp,
        c.amax ? &amax : nullptr,        c.amax ? &scale_inv : nullptr,   c.n,    c.f};
    auto go = [&](auto bwd, auto vec, auto e5) {
      emu::run_grid(grid, kFp8TileThreads, [&] {
        swiglu_fp8_kernel<T, decltype(bwd)::value, decltype(vec)::value, decltype(e5)::value>(a);
      });
    };
    auto with_e5 = [&](auto bwd, auto vec) {
      if (c.out == DType::kF8E5M2)
        go(bwd, vec, std::true_type{});
      else
        go(bwd, vec, std::false_type{});
    };
    auto with_vec = [&](auto bwd) {
      if (p.vec)
        with_e5(bwd, std::true_type{});
      else
        with_e5(bwd, std::false_type{});
    };
    if (c.bwd)
      with_vec(std::true_type{});
    else
      with_vec(std::false_type{});
  });

  const int64_t bad = emu_test::expect_quantized(
      c.n, k, scale, c.out,
      {y, yt, c.y, c.yt, amax, amax_before, c.amax, scale_inv, scale_inv_before},
      [&](int64_t row, int64_t col) { return static_cast<float>(r.get(row * k + col)); });
  std::printf("swiglu_fp8 %s: %s, %lld codes, amax %g\n", describe(c).c_str(),
              bad == 0 ? "bit-exact" : "MISMATCH", static_cast<long long>(c.n * k), amax);
}

TEST(SwigluFp8Emulation, VectorKernelsEveryDtype) {
  uint64_t seed = 1;
  for (bool bwd : {false, true})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (DType out : {DType::kF8E4M3, DType::kF8E5M2}) {
        // Partial tiles (N % 64, F % 64 != 0); several tiles a block.
        check({bwd, dt, out, 80, 136}, seed++);
        check({bwd, dt, out, 144, 200, 0, 0, 0, 0, true, true, true, 2}, seed++);
      }
}

TEST(SwigluFp8Emulation, ElementKernelsWhereChunksAreNotWhole) {
  uint64_t seed = 100;
  for (bool bwd : {false, true})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      // F not a multiple of the chunk, N not of 16; X, dY, Y and Yt off their alignment.
      Case c{bwd, dt, DType::kF8E4M3, 37, 50};
      c.want_vec = false;
      check(c, seed++);
      c = Case{bwd, dt, DType::kF8E5M2, 64, 72, 1, 1, 3, 5};
      c.grid = 2;
      c.want_vec = false;
      check(c, seed++);
    }
}

TEST(SwigluFp8Emulation, AbsentOutputs) {
  // The forward in evaluation (no Yt); only the transpose; no amax.
  Case c{false, DType::kBF16, DType::kF8E4M3, 64, 128};
  c.yt = false;
  check(c, 200);
  c = Case{true, DType::kBF16, DType::kF8E5M2, 64, 64};
  c.y = false;
  check(c, 201);
  c = Case{true, DType::kF16, DType::kF8E5M2, 48, 40};
  c.amax = false;
  c.grid = 3;
  check(c, 202);
  // Without Yt, N need not be a multiple of 16 for the vector kernel.
  c = Case{false, DType::kF32, DType::kF8E4M3, 33, 64};
  c.yt = false;
  check(c, 203);
}

// The plan's grid: one wave of resident blocks (3 a multiprocessor forward, 2 backward),
// fewer where there are fewer tiles.
TEST(SwigluFp8Emulation, PlanGrid) {
  Buf x(DType::kBF16, 64, 0);
  Codes y(64, 0);
  EXPECT_EQ(swiglu_fp8_plan(x.p, nullptr, y.p, y.p, DType::kBF16, 8192, 5632, 132).blocks,
            132u * 3);
  EXPECT_EQ(swiglu_fp8_plan(x.p, x.p, y.p, y.p, DType::kBF16, 8192, 5632, 132).blocks, 132u * 2);
  EXPECT_EQ(swiglu_fp8_plan(x.p, x.p, y.p, y.p, DType::kBF16, 128, 64, 132).blocks, 2u);
  EXPECT_EQ(swiglu_fp8_plan(x.p, x.p, y.p, y.p, DType::kBF16, 8192, 5632, 0).blocks,
            static_cast<unsigned>(kFp8MaxBlocks));
}

}  // namespace
}  // namespace loom::kernels::cuda::pointwise
