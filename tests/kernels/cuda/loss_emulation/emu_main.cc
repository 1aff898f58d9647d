// Runs the CUDA cross-entropy row kernels (kernels/cuda/loss/cross_entropy_kernel.cuh) on the
// CPU under emulation (emulation/emu_prelude.h and emu_runner.h: one fiber per
// CUDA thread, switched at barriers and warp shuffles in a shuffled order) and checks the
// one-pass cross_entropy_fwd_bwd kernel against the two kernels it replaces: loss, lse and
// dlogits bit for bit, staged through shared memory or read twice, into its own buffer or in
// place over the logits; and all of them against an f64 reference of loom/ops/loss.h (the op
// tests' tolerance for the dtype). Cases: f32, bf16 and f16 logits (bf16 with f32 dlogits too),
// rows whose base is one element off 16 bytes (the head / packs / tail split), vocabularies
// from 1 to 1003 columns with padding, masks with an out-of-range label under mask 0, an
// out-of-range label under mask 1 (reported, NaN loss, no onehot term), and grids smaller than
// the rows (the grid-stride loop). No GPU or nvcc involved.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

// Device-only pieces for host C++: a block's __shared__ variables become statics, which the
// fibers of the block share (one block runs at a time); fences are no-ops between fibers.
#undef __shared__
#define __shared__ static
inline void __threadfence_system() {}

#include "kernels/cuda/loss/cross_entropy_kernel.cuh"
#include "tests/kernels/cuda/emulation/emu_runner.h"

namespace loom::kernels::cuda::loss {

// The block's dynamic shared memory (ce_stage_words, cross_entropy_kernel.cuh): NaN-poisoned
// before each block, so that a read of a word the block did not stage shows.
alignas(16) uint4 g_stage[64 * 1024];
uint4* ce_stage_words() { return g_stage; }

namespace {

using emu::from_f;
using emu::to_f;

// Unit roundoff of the dtype: the op tests' tolerance scale.
template <class T>
double tol_of() {
  if constexpr (std::is_same_v<T, float>)
    return 1e-5;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return 2e-2;
  else
    return 2e-3;
}

struct Case {
  int64_t n, v, valid;
  bool mask, offset;  // offset: rows start one element past a 16-byte boundary
  unsigned grid;      // 0: one block per row
};

void run_poisoned(unsigned grid, unsigned block, std::function<void()> body) {
  emu::run_grid(dim3(grid, 1, 1), block, std::move(body), [] {
    std::memset(g_stage, 0xff, sizeof(g_stage));  // NaN in every float dtype
  });
}

struct Sink {
  unsigned claim = 0;
  LabelErrorRecord record{};
  LabelErrorSink view() { return {&claim, &record}; }
};

// The worst |dlogits - f64| / tolerance of the cases so far (printed per test).
double g_worst = 0;

template <class T, class D>
void check(const Case& c, std::mt19937& rng, bool staged, bool in_place) {
  static_assert(std::is_same_v<T, D> || std::is_same_v<D, float>);
  if (in_place && !std::is_same_v<T, D>) return;
  std::uniform_real_distribution<float> ud(-6.0f, 6.0f);
  const int64_t off = c.offset ? 1 : 0, nv = c.n * c.v;
  // Storage with room for the offset; every row starts at base + n * V.
  std::vector<T> x_store(nv + 8);
  T* x = x_store.data() + off;
  for (int64_t i = 0; i < nv; ++i) x[i] = from_f<T>(ud(rng));
  std::vector<int32_t> labels(c.n);
  std::vector<float> mask(c.n, 1.0f);
  for (int64_t i = 0; i < c.n; ++i) labels[i] = static_cast<int32_t>(rng() % c.valid);
  if (c.mask)
    for (int64_t i = 0; i < c.n; i += 3) {
      mask[i] = 0.0f;
      labels[i] = i % 2 ? -100 : static_cast<int32_t>(c.valid);  // masked: no error
    }
  const float* mp = c.mask ? mask.data() : nullptr;
  double total = 0;
  for (int64_t i = 0; i < c.n; ++i) total += mp ? mask[i] : 1.0;
  const float dmean = 1.7f;
  const unsigned grid = c.grid ? c.grid : static_cast<unsigned>(c.n);
  const int threads = row_threads(c.v);
  const std::string what =
      std::string(staged ? "staged" : "unstaged") + (in_place ? " in place" : "") + " N " +
      std::to_string(c.n) + " V " + std::to_string(c.v) + " valid " + std::to_string(c.valid) +
      (c.mask ? " mask" : "") + (c.offset ? " offset" : "") + " grid " + std::to_string(grid) +
      " sizeof(T) " + std::to_string(sizeof(T)) + " sizeof(D) " + std::to_string(sizeof(D));

  // The two kernels.
  std::vector<float> loss(c.n, NAN), lse(c.n, NAN);
  std::vector<D> dx_store(nv + 8, from_f<D>(NAN));
  D* dx = dx_store.data() + off;
  Sink s1;
  run_poisoned(grid, threads, [&] {
    ce_fwd_kernel<T>(x, labels.data(), mp, loss.data(), lse.data(), c.n, c.v, c.valid, s1.view());
  });
  run_poisoned(grid, threads, [&] {
    ce_bwd_kernel<T, D>(x, labels.data(), mp, lse.data(), &dmean, nullptr, total, dx, c.n, c.v,
                        c.valid, 0, c.valid, s1.view());
  });
  ASSERT_EQ(s1.claim, 0u) << what << ": a masked label was reported";

  // The one pass.
  std::vector<T> x_copy = x_store;
  T* x1 = x_copy.data() + off;
  std::vector<D> dx1_store(nv + 8, from_f<D>(NAN));
  D* dx1 = in_place ? reinterpret_cast<D*>(x1) : dx1_store.data() + off;
  std::vector<float> loss1(c.n, NAN), lse1(c.n, NAN);
  Sink s2;
  auto body = [&] {
    if (staged)
      ce_fwd_bwd_kernel<T, D, true>(x1, labels.data(), mp, loss1.data(), lse1.data(), &dmean,
                                    nullptr, total, dx1, c.n, c.v, c.valid, s2.view());
    else
      ce_fwd_bwd_kernel<T, D, false>(x1, labels.data(), mp, loss1.data(), lse1.data(), &dmean,
                                     nullptr, total, dx1, c.n, c.v, c.valid, s2.view());
  };
  ASSERT_LE(static_cast<size_t>(c.v) * sizeof(T) + 16, sizeof(g_stage));
  run_poisoned(grid, threads, body);
  ASSERT_EQ(s2.claim, 0u) << what;
  ASSERT_EQ(0, std::memcmp(loss1.data(), loss.data(), c.n * sizeof(float))) << what << ": loss";
  ASSERT_EQ(0, std::memcmp(lse1.data(), lse.data(), c.n * sizeof(float))) << what << ": lse";
  for (int64_t i = 0; i < nv; ++i)
    ASSERT_EQ(0, std::memcmp(&dx1[i], &dx[i], sizeof(D)))
        << what << ": dlogits[" << i << "] = " << to_f(dx1[i]) << ", the two kernels' "
        << to_f(dx[i]);
  if (!in_place) {
    ASSERT_EQ(0, std::memcmp(x_copy.data(), x_store.data(), x_store.size() * sizeof(T)))
        << what << ": the logits changed";
  }

  // f64: loss, lse and the gradient (padding columns exactly 0).
  for (int64_t i = 0; i < c.n; ++i) {
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < c.valid; ++j)
      m = std::max(m, static_cast<double>(to_f(x[i * c.v + j])));
    for (int64_t j = 0; j < c.valid; ++j) sum += std::exp(to_f(x[i * c.v + j]) - m);
    const double l = m + std::log(sum), w = dmean * (mp ? mask[i] : 1.0) / total;
    const bool in_vocab = labels[i] >= 0 && labels[i] < c.valid;
    if (in_vocab) {
      const double e = l - to_f(x[i * c.v + labels[i]]);
      ASSERT_NEAR(loss[i], e, 1e-5 * (1 + std::fabs(e))) << what << ": loss[" << i << "]";
    } else {
      ASSERT_EQ(loss[i], 0.0f) << what << ": masked loss[" << i << "]";
    }
    ASSERT_NEAR(lse[i], l, 1e-5 * (1 + std::fabs(l))) << what << ": lse[" << i << "]";
    for (int64_t j = 0; j < c.v; ++j) {
      const double g =
          j >= c.valid ? 0.0
                       : w * (std::exp(to_f(x[i * c.v + j]) - l) - (j == labels[i] ? 1.0 : 0.0));
      const double got = to_f(dx[i * c.v + j]);
      if (j >= c.valid) {
        ASSERT_EQ(got, 0.0) << what << ": padding dlogits[" << i << ", " << j << "]";
      }
      // A masked row (w = 0) must be exactly 0.
      const double err = std::fabs(got - g) / (tol_of<D>() * (std::fabs(g) + 1e-3 * w) + 1e-30);
      g_worst = std::max(g_worst, err);
      ASSERT_LE(err, 1.0) << what << ": dlogits[" << i << ", " << j << "] = " << got << ", f64 "
                          << g;
    }
  }
}

const std::vector<Case> kCases = {
    {1, 1, 1, false, false, 0},      {3, 7, 7, true, true, 0},      {5, 65, 62, true, false, 0},
    {4, 65, 65, false, true, 2},     {6, 1000, 997, true, true, 4}, {2, 1003, 1003, false, true, 0},
    {7, 1003, 1000, true, false, 3},
};

template <class T, class D>
void check_all() {
  std::mt19937 rng(11);
  g_worst = 0;
  for (const Case& c : kCases)
    for (bool staged : {true, false})
      for (bool in_place : {false, true}) {
        check<T, D>(c, rng, staged, in_place);
        if (::testing::Test::HasFatalFailure()) return;
      }
  printf("  dlogits against f64: worst |error| / tolerance %.3g\n", g_worst);
}

TEST(CrossEntropyEmulation, OnePassEqualsTheTwoKernelsF32) { check_all<float, float>(); }
TEST(CrossEntropyEmulation, OnePassEqualsTheTwoKernelsBf16) {
  check_all<__nv_bfloat16, __nv_bfloat16>();
}
TEST(CrossEntropyEmulation, OnePassEqualsTheTwoKernelsF16) { check_all<__half, __half>(); }
TEST(CrossEntropyEmulation, OnePassEqualsTheTwoKernelsBf16LogitsF32Gradient) {
  check_all<__nv_bfloat16, float>();
}

// A label outside the vocabulary under mask 1: the one pass reports it once (op
// cross_entropy_fwd_bwd, its row, label and vocabulary), writes a NaN loss for that row, and
// leaves the onehot term out of its gradient, as the two kernels do.
TEST(CrossEntropyEmulation, OutOfRangeLabelIsReportedAndLeavesNoOnehot) {
  const int64_t n = 3, v = 8;
  std::vector<float> x(n * v), loss(n, 0), lse(n, 0), dx(n * v, NAN);
  for (int64_t i = 0; i < n * v; ++i) x[i] = 0.25f * static_cast<float>(i % 5);
  std::vector<int32_t> labels = {2, 9, 0};
  const float dmean = 1.0f;
  Sink s;
  run_poisoned(n, row_threads(v), [&] {
    ce_fwd_bwd_kernel<float, float, true>(x.data(), labels.data(), nullptr, loss.data(), lse.data(),
                                          &dmean, nullptr, 3.0, dx.data(), n, v, v, s.view());
  });
  ASSERT_EQ(s.claim, 1u);
  EXPECT_EQ(s.record.set, 1);
  EXPECT_EQ(s.record.op, static_cast<int32_t>(LabelOp::kFwdBwd));
  EXPECT_EQ(s.record.row, 1);
  EXPECT_EQ(s.record.label, 9);
  EXPECT_EQ(s.record.vocab, 8);
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_FALSE(std::isnan(loss[0]));
  double row_sum = 0;  // softmax terms only: they sum to w = 1/3
  for (int64_t j = 0; j < v; ++j) row_sum += dx[v + j];
  EXPECT_NEAR(row_sum, 1.0 / 3.0, 1e-6);
}

}  // namespace
}  // namespace loom::kernels::cuda::loss
