// The in-register 3xTF32 GEMM (kernels/cuda/gemm/tf32x3_mma.cuh) on the CPU: its kernels
// compiled as host C++ under the shared emulation prelude (one fiber per CUDA thread,
// emu_runner.h), with cp.async and mma.sync m16n8k8 emulated from the PTX ISA's fragment
// layouts (kernels/cuda/gemm/tf32_mma.cuh here), run through the driver's own sequence of
// launches (tf32x3_mma_launches); compared with a long double GEMM written in the test.
//  - the error relative to sum |alpha a b| at f32 level, beside a plain f32 GEMM's and one
//    TF32 GEMM's, over both tiles, 16- and 4-byte copies, transposes, batches, shared and
//    batched B, alpha, beta (0 with NaN in Y), a bias, partial tiles, K not a multiple of 16,
//    and K split into ranges; the operands read as truncated and as rounded TF32;
//  - both tiles and both copy widths give the same bits, and so do copies deferred to their
//    wait with warps stalled behind the others; nothing outside Y is written;
//  - the plan (tile, ranges) on the default spec's shapes and at the capacity's edge.
// No GPU or nvcc involved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// A block's __shared__ arrays become statics, which the fibers of the block (one block runs
// at a time) share.
#undef __shared__
#define __shared__ static

#include "kernels/cuda/gemm/tf32x3_mma.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"
#include "tests/kernels/cuda/gemm_emulation/gemm_oracle.h"

#ifndef LOOM_TF32_MMA_EMULATED
#error "the inline-PTX tf32_mma.cuh was included instead of the emulated one"
#endif

namespace loom::kernels::cuda::gemm {
namespace {

using Case = GemmCase;
constexpr Tf32x3Form kRegisters = Tf32x3Form::kInRegisters;

// A and B, and Y in the runs, have a guard of NaN on both sides; Y's must stay NaN.
constexpr size_t kGuard = 64;

std::vector<float> guarded(size_t n) { return std::vector<float>(n + 2 * kGuard, NAN); }

// Under the sanitizers (BUILD sets LOOM_EMU_QUICK), where a fiber costs several times more,
// the variants that change numbers but not memory accesses run once: the operands read as
// truncated TF32 only, GELU's tanh form only, K in one range in the schedule test.
bool quick() {
  static const bool q = std::getenv("LOOM_EMU_QUICK") != nullptr;
  return q;
}

// The driver's launches on the emulator: Y (with its guard) after the call under `plan`.
std::vector<float> run(const Case& c, const Problem& p, const Tf32x3MmaPlan& plan, bool vec,
                       const Tf32x3Activation& act = {}) {
  const Tf32x3Shape s = shape_of(c, kRegisters);
  std::vector<float> y = guarded(p.y0.size());
  std::copy(p.y0.begin(), p.y0.end(), y.begin() + kGuard);
  std::vector<float> partial(static_cast<size_t>(plan.splits * c.batch * c.m * c.n), NAN);
  auto launch = [&](const Tf32x3MmaLaunch& l) {
    emu::run_grid(dim3(l.grid_x, l.grid_y, l.grid_z), kTf32x3MmaThreads,
                  [&] { l.kernel(l.params); });
  };
  auto sum = [&](const Tf32x3PartialSumParams& q) {
    // Fewer blocks than elements: the grid-stride loop runs more than once.
    emu::run_grid(2, kTf32x3SumThreads, [&] { tf32x3_partial_sum_kernel(q); });
  };
  tf32x3_mma_launches(s, plan, p.A(), p.B(), y.data() + kGuard, c.alpha, c.beta,
                      c.bias ? p.bias.data() : nullptr, act, vec, partial.data(), launch, sum);
  return y;
}

// max |y - oracle| / scale over Y (y holds Y with its guard); fails the test where the guard
// was written.
double guarded_error(const std::vector<float>& y, const std::vector<long double>& want,
                     const std::vector<double>& scale, const std::string& what) {
  for (size_t i = 0; i < kGuard; ++i) {
    EXPECT_TRUE(std::isnan(y[i])) << what << ": wrote before Y at " << i;
    EXPECT_TRUE(std::isnan(y[y.size() - 1 - i])) << what << ": wrote past Y";
  }
  return rel_error(y.data() + kGuard, want, scale);
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
}

// The split the kernel feeds the tensor cores: the high half split_tf32's, the low half the
// rest rounded to TF32 with ties to even (about a quarter of the low halves are ties; rounding
// them away from zero biased the small products and doubled one case's error above).
TEST(Tf32x3Mma, SplitOperandRoundsTheLowHalfToEven) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<uint32_t> any;
  int ties = 0, checked = 0;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = any(rng);
    u = (u & 0x807fffffu) | ((u % 200u + 27u) << 23);  // exponents 2^-100 .. 2^99
    float x;
    std::memcpy(&x, &u, 4);
    uint32_t hi = 0, lo = 0;
    split_operand(x, &hi, &lo);
    float h, l;
    split_tf32(x, &h, &l);
    float hf, lf;
    std::memcpy(&hf, &hi, 4);
    std::memcpy(&lf, &lo, 4);
    ASSERT_EQ(hf, h) << std::hexfloat << x;
    ASSERT_EQ(static_cast<double>(lf), rne_tf32(l)) << std::hexfloat << x << " lo " << l;
    ASSERT_LE(std::fabs(static_cast<double>(x) - hf - lf), std::ldexp(std::fabs(x), -22));
    if (l != 0.0f) {  // a tie: the low half's bits past TF32's 11 are exactly one half unit
      const double units = std::ldexp(static_cast<double>(std::fabs(l)), 10 - std::ilogb(l));
      if (units - std::floor(units) == 0.5) ++ties;
    }
    ++checked;
  }
  std::printf("split_operand: %d values, %d low halves on a tie, each rounded to even\n", checked,
              ties);
  EXPECT_GT(ties, checked / 10);  // the case the rounding is about does occur
}

// The emulated tensor cores add an mma's products as the hardware was measured to
// (emu_tc_sum, kTruncated, the default every test here runs under): the addends aligned to
// the largest, the bits below the window dropped, the sum truncated toward zero. With that
// model and the accumulator as each mma's addend, the kernel gave up to 8.3e-7 of sum |a b|
// on the accuracy test's cases, over its 4e-7 (the H200: up to 1.7e-6 on the GPU test's);
// summed from zero per 8 columns, as the kernel now does, 4.8e-8 to 1.4e-7.
TEST(Tf32x3Mma, TheModelledTensorCoresTruncateTheirSums) {
  ASSERT_EQ(emu_tc_sum_mode, EmuTcSum::kTruncated);
  double prod[8] = {};
  prod[0] = std::ldexp(3.0, -24);  // 1.5 units of 1's last place: f32 rounds to 2, ties to even
  EXPECT_EQ(emu_tc_sum(1.0f, prod), 1.0f + std::ldexp(1.0f, -23));
  prod[0] = -prod[0];
  EXPECT_EQ(emu_tc_sum(-1.0f, prod), -1.0f - std::ldexp(1.0f, -23));  // toward zero
  prod[0] = std::ldexp(1.0, -30);  // below the window of 1's 24 + emu_tc_align_bits bits
  EXPECT_EQ(emu_tc_sum(1.0f, prod), 1.0f);
  prod[0] = 0.75, prod[1] = -0.25, prod[2] = std::ldexp(1.0, -20);  // in the window: exact
  EXPECT_EQ(emu_tc_sum(0.0f, prod), 0.5f + std::ldexp(1.0f, -20));
  EXPECT_TRUE(std::isnan(emu_tc_sum(NAN, prod)));
}

// The plan with the tile and the ranges a test names.
Tf32x3MmaPlan plan_of(const Case& c, bool large, int64_t splits) {
  Tf32x3MmaPlan plan;
  plan.large = large;
  plan.k_split = round_up(ceil_div(c.k, splits), kTf32x3TileK);
  plan.splits = ceil_div(c.k, plan.k_split);
  return plan;
}

TEST(Tf32x3Mma, F32AccuracyOverTilesLayoutsBatchesAndRanges) {
  std::mt19937 rng(5);
  const Case cases[] = {
      {1, 130, 70, 100, false, true, true, 1.0f, 0.0f, false},  // partial tiles of both sizes
      {1, 40, 36, 129, true, false, true, 1.0f, 1.0f, true},    // a weight gradient's form
      {3, 9, 12, 70, false, false, true, -0.5f, 1.0f, false},   // shared B folded into M
      {2, 20, 12, 48, true, true, false, 1.5f, 0.5f, true},     // batched B, both transposed
      {2, 17, 9, 5, true, false, true, 1.0f, 0.0f, true},       // K < 8, shared B not folded
      {1, 33, 20, 600, false, false, true, 1.0f, 0.0f, false},  // long K: ranges below
  };
  for (const Case& c : cases) {
    const Problem p = make(c, rng, kGuard);
    std::vector<long double> want;
    std::vector<double> scale;
    oracle(c, p, &want, &scale);
    const auto [f32, one_tf32] = baselines(c, p, want, scale);
    const bool vec_ok = tf32x3_mma_vec(shape_of(c, kRegisters), p.A(), p.B());
    for (int64_t splits : {int64_t{1}, int64_t{3}}) {
      if (splits > 1 && c.k < 200) continue;
      std::vector<float> first;
      for (bool large : {true, false})
        for (bool vec : {false, true}) {
          if (vec && !vec_ok) continue;
          for (EmuTf32 mode : {EmuTf32::kTruncate, EmuTf32::kNearest}) {
            if (quick() && mode == EmuTf32::kNearest) continue;
            emu_tf32_mode = mode;
            const long mmas = emu_mma_count;
            const std::vector<float> y = run(c, p, plan_of(c, large, splits), vec);
            const std::string what = describe(c) + (large ? ", 128 x 64" : ", 64 x 32") +
                                     (vec ? ", 16-byte copies" : ", 4-byte copies") + ", " +
                                     std::to_string(splits) + " range(s)";
            const double e = guarded_error(y, want, scale, what);
            std::printf("%s, TF32 %s: 3xTF32 %.3g, f32 %.3g, one TF32 %.3g (of sum |a b|)\n",
                        what.c_str(), mode == EmuTf32::kTruncate ? "truncated" : "rounded", e, f32,
                        one_tf32);
            EXPECT_GT(emu_mma_count, mmas) << what;
            // f32 level, as the split form's test asks (gemm_emulation's emu_main.cc), and far
            // below one TF32 product's error, which the check must be able to tell apart.
            EXPECT_LE(e, 4e-7) << what;
            EXPECT_LE(e, 4 * f32 + 1e-7) << what;
            EXPECT_GT(one_tf32, 30 * e) << what;
            // The tile and the copy width change nothing in the sums' order.
            if (mode != EmuTf32::kTruncate) continue;
            if (first.empty())
              first = y;
            else
              EXPECT_TRUE(same_bits(first, y)) << what << ": other bits than the first run";
          }
        }
    }
  }
  emu_tf32_mode = EmuTf32::kTruncate;
}

// The copies landing only at their group's wait (as the hardware may have them), and warps
// left behind while the others run ahead to the next barrier (emu::g_stall_warps), give the
// same bits: no stage is read before its wait, and none is overwritten while a warp still
// reads it.
TEST(Tf32x3Mma, DeferredCopiesAndStalledWarpsGiveTheSameBits) {
  std::mt19937 rng(6);
  const Case cases[] = {
      {1, 70, 40, 92, false, true, true, 1.0f, 0.0f, true},     // 16-byte copies
      {2, 36, 24, 300, true, false, false, 1.0f, 1.0f, false},  // 16-byte copies
      {1, 33, 40, 90, false, false, true, 1.0f, 0.0f, false},   // 4-byte copies
  };
  for (const Case& c : cases) {
    const Problem p = make(c, rng, kGuard);
    for (int64_t splits : {int64_t{1}, int64_t{2}})
      for (bool large : {true, false}) {
        if (quick() && splits > 1) continue;
        const bool vec = tf32x3_mma_vec(shape_of(c, kRegisters), p.A(), p.B());
        emu::g_stall_warps = false;
        const std::vector<float> fair = run(c, p, plan_of(c, large, splits), vec);
        // A copy may land any time between its issue and its wait: at the one end (deferred)
        // and at the other (immediate), each with stalled warps.
        emu::g_stall_warps = true;
        for (bool deferred : {true, false}) {
          emu::g_deferred_cp = deferred;
          const std::vector<float> y = run(c, p, plan_of(c, large, splits), vec);
          EXPECT_TRUE(same_bits(fair, y))
              << describe(c) << ", " << splits << " range(s), stalled warps, "
              << (deferred ? "deferred" : "immediate") << " copies";
        }
        emu::g_deferred_cp = false;
      }
  }
}

// GELU and its derivative, in long double (gelu.cu's two forms).
long double gelu_ref(long double x, bool tanh_form) {
  if (tanh_form) {
    const long double c = std::sqrt(2.0L / 3.14159265358979323846L);
    return 0.5L * x * (1.0L + std::tanh(c * (x + 0.044715L * x * x * x)));
  }
  return 0.5L * x * std::erfc(-x / std::sqrt(2.0L));
}
long double dgelu_ref(long double x, bool tanh_form) {
  if (tanh_form) {
    const long double c = std::sqrt(2.0L / 3.14159265358979323846L);
    const long double th = std::tanh(c * (x + 0.044715L * x * x * x));
    return 0.5L * (1.0L + th) + 0.5L * x * (1.0L - th * th) * c * (1.0L + 3.0L * 0.044715L * x * x);
  }
  return 0.5L * std::erfc(-x / std::sqrt(2.0L)) +
         x * std::exp(-0.5L * x * x) / std::sqrt(2.0L * 3.14159265358979323846L);
}

// gemm_epilogue's kEpilogueGelu and kEpilogueDGelu in the GEMM's epilogue, against the long
// double oracle: P (kept in aux) within the GEMM's bound; Y = gelu(P) within the GEMM's bound
// carried through gelu' plus 4e-6 of Y for f32's gelu; Y = gelu'(P) Z alike. Both tiles, and
// K in one range and in three (the activation then runs in the partial sums' kernel).
TEST(Tf32x3Mma, GeluAndItsDerivativeInTheEpilogue) {
  std::mt19937 rng(7);
  const Case gelu_case{1, 70, 40, 300, false, true, true, 1.0f, 0.0f, true};    // a Linear + bias
  const Case dgelu_case{1, 40, 36, 600, false, true, true, 1.0f, 0.0f, false};  // dX, long K
  for (Tf32x3Activation::Kind kind : {Tf32x3Activation::kGelu, Tf32x3Activation::kDGelu}) {
    const Case& c = kind == Tf32x3Activation::kGelu ? gelu_case : dgelu_case;
    const Problem p = make(c, rng, kGuard);
    std::vector<long double> want;
    std::vector<double> scale;
    oracle(c, p, &want, &scale);
    // DGELU's P: pre-activations around the GELU's bend.
    std::vector<float> pre(want.size());
    std::normal_distribution<float> nd(0.0f, 1.5f);
    for (float& v : pre) v = nd(rng);
    for (bool tanh_form : {true, false})
      for (bool keep : {true, false})
        for (int64_t splits : {int64_t{1}, int64_t{3}})
          for (bool large : {true, false}) {
            if (kind == Tf32x3Activation::kDGelu && !keep) continue;  // aux is GELU's only
            if (splits > 1 && !large) continue;  // the partial sums' kernel has no tile
            if (quick() && !tanh_form) continue;
            std::vector<float> aux(want.size(), NAN);
            Tf32x3Activation act;
            act.kind = kind;
            act.tanh = tanh_form;
            act.aux = kind == Tf32x3Activation::kGelu && keep ? aux.data() : nullptr;
            act.p = kind == Tf32x3Activation::kDGelu ? pre.data() : nullptr;
            const bool vec = tf32x3_mma_vec(shape_of(c, kRegisters), p.A(), p.B());
            const std::vector<float> y = run(c, p, plan_of(c, large, splits), vec, act);
            const std::string what =
                std::string(kind == Tf32x3Activation::kGelu ? "gelu" : "dgelu") +
                (tanh_form ? " tanh" : " erf") + (large ? ", 128 x 64" : ", 64 x 32") + ", " +
                std::to_string(splits) + " range(s)" + (act.aux ? ", aux" : "");
            double worst_y = 0.0, worst_aux = 0.0;
            for (size_t i = 0; i < want.size(); ++i) {
              const long double z = want[i];
              const long double x = kind == Tf32x3Activation::kGelu ? z : pre[i];
              const long double d = std::fabs(dgelu_ref(x, tanh_form));
              const long double ref = kind == Tf32x3Activation::kGelu ? gelu_ref(z, tanh_form)
                                                                      : dgelu_ref(x, tanh_form) * z;
              // The GEMM's error carried through gelu'; f32's gelu, relative; and f32's
              // gelu' (its terms are of order 1 + |x|: where they cancel, near gelu' = 0, its
              // error is absolute) times Z.
              const long double bound =
                  d * 4e-7L * scale[i] + 4e-6L * std::fabs(ref) +
                  (kind == Tf32x3Activation::kDGelu ? 1e-6L * (1.0L + std::fabs(x)) * std::fabs(z)
                                                    : 0.0L) +
                  1e-30L;
              const long double got = y[i + kGuard];
              worst_y = std::max(worst_y, static_cast<double>(std::isnan(static_cast<double>(got))
                                                                  ? INFINITY
                                                                  : std::fabs(got - ref) / bound));
              if (act.aux != nullptr)
                worst_aux = std::max(
                    worst_aux, static_cast<double>(std::fabs(aux[i] - z) / (4e-7L * scale[i])));
            }
            std::printf("%s: Y at %.3g of its bound, aux at %.3g of the GEMM's\n", what.c_str(),
                        worst_y, worst_aux);
            EXPECT_LE(worst_y, 1.0) << what;
            EXPECT_LE(worst_aux, 1.0) << what;
            if (act.aux == nullptr && kind == Tf32x3Activation::kGelu) {
              for (float v : aux) ASSERT_TRUE(std::isnan(v)) << what << ": aux written";
            }
          }
  }
}

// The geometry on the default spec's GEMMs (2048 tokens, C 256, 4 x C MLP, vocabulary 4096)
// on an H200 (132 multiprocessors) with the stream scratch (32 MiB) for partial sums.
TEST(Tf32x3MmaPlan, TilesAndRangesOnTheDefaultSpec) {
  const size_t scratch = size_t{32} << 20;
  struct Want {
    int64_t m, n, k;
    bool large;
    int64_t splits;
  };
  const Want wants[] = {
      {2048, 768, 256, true, 1},    // QKV forward: 16 x 12 = 192 large tiles
      {2048, 1024, 256, true, 1},   // fc1 forward
      {2048, 256, 1024, false, 1},  // fc2 forward: 64 large tiles, 256 small
      {2048, 256, 256, false, 1},   // proj forward and dX
      {2048, 4096, 256, true, 1},   // the output layer
      {256, 768, 2048, false, 2},   // a weight gradient: 96 small tiles, 2 ranges of 1024
      {256, 256, 2048, false, 5},   // proj's: 32 small tiles, ceil(132 / 32) = 5 ranges
      {1024, 256, 2048, false, 2},  // fc2's: 128 small tiles, 4 multiprocessors idle
      {4096, 256, 2048, false, 1},  // the output layer's: 128 large tiles, 512 small
  };
  for (const Want& w : wants) {
    const Tf32x3MmaPlan plan = plan_tf32x3_mma(1, w.m, w.n, w.k, 132, scratch);
    EXPECT_EQ(plan.large, w.large) << w.m << " x " << w.n << " x " << w.k;
    EXPECT_EQ(plan.splits, w.splits) << w.m << " x " << w.n << " x " << w.k;
    EXPECT_EQ(plan.k_split % kTf32x3TileK, 0);
    EXPECT_GE(plan.splits * plan.k_split, w.k);
    EXPECT_LT((plan.splits - 1) * plan.k_split, w.k);
    if (plan.splits > 1) {
      EXPECT_GE(plan.k_split, kTf32x3MinSplitK);
    }
  }
  // The partial sums must fit: 4 ranges of 256 x 256 floats is 1 MiB.
  EXPECT_EQ(plan_tf32x3_mma(1, 256, 256, 8192, 132, size_t{1} << 20).splits, 4);
  EXPECT_EQ(plan_tf32x3_mma(1, 256, 256, 8192, 132, (size_t{1} << 20) - 1).splits, 3);
  // A short K is not split, nor is anything that fills the GPU already.
  EXPECT_EQ(plan_tf32x3_mma(1, 64, 64, 300, 132, scratch).splits, 1);
  EXPECT_EQ(plan_tf32x3_mma(80, 64, 64, 4096, 132, scratch).splits, 1);  // 160 small tiles
}

}  // namespace
}  // namespace loom::kernels::cuda::gemm
