// The mixture-of-experts ops (loom/ops/moe.h): grouped_gemm and grouped_gemm_wgrad (reference
// against per-group f64 GEMMs written here, fast against reference, zero-row groups),
// moe_topk (against a selection written here by sorting, over every score option, ties and
// group limits) and moe_topk_bwd (against finite differences), on f32 and f64 logits,
// moe_permute / moe_unpermute / moe_unpermute_bwd (against loops written here), and bad
// indices refused. The ops without pointer arrays also run on every device backend linked in
// (the CUDA kernels on a GPU).
#include <algorithm>
#include <cmath>
#include <numeric>

#include <gmock/gmock.h>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

// ---- grouped_gemm -----------------------------------------------------------------------

struct Groups {
  std::vector<int64_t> rows;  // per group, some zero
  int64_t total() const { return std::accumulate(rows.begin(), rows.end(), int64_t{0}); }
};

const std::vector<Groups>& group_cases() {
  static const std::vector<Groups> c = {{{5}}, {{3, 0, 7, 1}}, {{0, 0, 4}}, {{0, 0}}, {{9, 2, 0}}};
  return c;
}

class GroupedGemmTest : public ::testing::TestWithParam<DType> {};

TEST_P(GroupedGemmTest, EachGroupIsItsOwnGemm) {
  const DType dt = GetParam();
  std::mt19937 rng(3);
  const int64_t kd = 13, nd = 6;
  for (const Groups& g : group_cases())
    for (int trans_b : {0, 1})
      for (float beta : {0.0f, 1.0f}) {
        const int64_t m = g.total(), groups = static_cast<int64_t>(g.rows.size());
        Tensor x = Tensor::random(dt, {m, kd}, rng);
        std::vector<Tensor> w;
        std::vector<void*> ptrs;
        for (int64_t i = 0; i < groups; ++i) {
          w.push_back(Tensor::random(dt, trans_b ? std::vector<int64_t>{nd, kd}
                                                 : std::vector<int64_t>{kd, nd},
                                     rng));
        }
        for (Tensor& t : w) ptrs.push_back(t.raw());
        Tensor y0 = Tensor::random(dt, {m, nd}, rng);
        // Expected, per group in f64: Y[r] = 1.5 X[r] W_g^(T) + beta Y[r].
        std::vector<double> expected(static_cast<size_t>(m * nd));
        int64_t r0 = 0;
        for (int64_t gi = 0; gi < groups; ++gi) {
          for (int64_t r = r0; r < r0 + g.rows[gi]; ++r)
            for (int64_t j = 0; j < nd; ++j) {
              double acc = 0;
              for (int64_t p = 0; p < kd; ++p)
                acc += x.get(r * kd + p) * w[gi].get(trans_b ? j * kd + p : p * nd + j);
              expected[r * nd + j] = 1.5 * acc + beta * y0.get(r * nd + j);
            }
          r0 += g.rows[gi];
        }
        ops::GroupedGemmAttrs at{static_cast<int32_t>(groups), g.rows.data(), ptrs.data(), trans_b,
                                 1.5f, beta};
        const std::string what = "groups " + std::to_string(groups) + " rows " +
                                 std::to_string(m) + " trans_b " + std::to_string(trans_b);
        for (const char* name : {"cpu.ref", "cpu.fast"}) {
          if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
          Tensor y = y0;
          run(ops::kGroupedGemm, name, dt, {&x, &w[0]}, {&y}, &at);
          expect_close(y, expected, dt, std::string(name) + " " + what);
        }
      }
}

TEST_P(GroupedGemmTest, WeightGradientsPerGroupAndZeroForEmptyGroups) {
  const DType dt = GetParam();
  std::mt19937 rng(4);
  const int64_t kd = 7, nd = 5;
  for (const Groups& g : group_cases())
    for (float beta : {0.0f, 1.0f})
      for (const char* name : {"cpu.ref", "cpu.fast"}) {
        if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
        const int64_t m = g.total(), groups = static_cast<int64_t>(g.rows.size());
        Tensor dy = Tensor::random(dt, {m, nd}, rng), x = Tensor::random(dt, {m, kd}, rng);
        std::vector<Tensor> dw;
        std::vector<void*> ptrs;
        for (int64_t i = 0; i < groups; ++i) dw.push_back(Tensor::random(DType::kF32, {nd, kd}, rng));
        std::vector<std::vector<double>> expected;
        int64_t r0 = 0;
        for (int64_t gi = 0; gi < groups; ++gi) {
          std::vector<double> e(static_cast<size_t>(nd * kd));
          for (int64_t i = 0; i < nd; ++i)
            for (int64_t j = 0; j < kd; ++j) {
              double acc = 0;
              for (int64_t r = r0; r < r0 + g.rows[gi]; ++r) acc += dy.get(r * nd + i) * x.get(r * kd + j);
              e[i * kd + j] = acc + beta * dw[gi].get(i * kd + j);
            }
          expected.push_back(std::move(e));
          r0 += g.rows[gi];
        }
        for (Tensor& t : dw) ptrs.push_back(t.raw());
        ops::GroupedGemmAttrs at{static_cast<int32_t>(groups), g.rows.data(), ptrs.data(), 0, 1.0f,
                                 beta};
        run(ops::kGroupedGemmWgrad, name, dt, {&dy, &x}, {&dw[0]}, &at);
        for (int64_t gi = 0; gi < groups; ++gi)
          expect_close(dw[gi], expected[gi], dt,
                       std::string(name) + " group " + std::to_string(gi) + " of rows " +
                           std::to_string(g.rows[gi]) + " beta " + std::to_string(beta));
      }
}

TEST(GroupedGemmErrors, RowsThatDoNotAddUpAreRefused) {
  std::mt19937 rng(5);
  Tensor x = Tensor::random(DType::kF32, {4, 3}, rng), w = Tensor::random(DType::kF32, {2, 3}, rng);
  Tensor y(DType::kF32, {4, 2});
  std::vector<int64_t> rows = {1, 2};
  std::vector<void*> ptrs = {w.raw(), w.raw()};
  ops::GroupedGemmAttrs at{2, rows.data(), ptrs.data(), 1, 1.0f, 0.0f};
  Status s = call_kernel(ops::kGroupedGemm, "cpu.ref", DType::kF32, {&x, &w}, {&y}, &at);
  EXPECT_EQ(s.code, Code::kUnimplemented);  // supports declines it
  status_release(&s);
  const KernelDesc& k = kernel(ops::kGroupedGemm, DType::kF32, "cpu.ref");
  CallHolder h({&x, &w}, {&y}, &at);
  s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&s), ::testing::HasSubstr("group_rows sum to 3, but the rows are M = 4"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GroupedGemmTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// ---- moe_topk ---------------------------------------------------------------------------

// The router's choice written plainly: rank by (score desc, id asc) with std::sort.
void expected_topk(const std::vector<double>& l, const std::vector<double>& bias,
                   const ops::MoeTopkAttrs& a, std::vector<double>* probs,
                   std::vector<int32_t>* ids) {
  const int64_t e = static_cast<int64_t>(l.size()), k = a.k;
  std::vector<double> s(e), sel(e);
  double mx = *std::max_element(l.begin(), l.end()), z = 0;
  for (int64_t i = 0; i < e; ++i) z += std::exp(l[i] - mx);
  for (int64_t i = 0; i < e; ++i) {
    s[i] = a.score == 1 ? 1 / (1 + std::exp(-l[i])) : std::exp(l[i] - mx) / z;
    sel[i] = a.score == 1 ? s[i] + (bias.empty() ? 0 : bias[i]) : a.pre_softmax ? s[i] : l[i];
  }
  auto by_rank = [&](const std::vector<double>& v) {
    return [&v](int64_t x, int64_t y) { return v[x] > v[y] || (v[x] == v[y] && x < y); };
  };
  std::vector<int64_t> order(e);
  std::iota(order.begin(), order.end(), 0);
  std::vector<bool> allowed(e, true);
  const int32_t groups = std::max(a.num_groups, 1);
  if (groups > 1) {
    const int64_t per = e / groups;
    std::vector<double> gs(groups);
    for (int32_t g = 0; g < groups; ++g) {
      std::vector<int64_t> in(per);
      std::iota(in.begin(), in.end(), g * per);
      std::sort(in.begin(), in.end(), by_rank(sel));
      for (int64_t i = 0; i < k / a.group_topk; ++i) gs[g] += sel[in[i]];
    }
    std::vector<int64_t> go(groups);
    std::iota(go.begin(), go.end(), 0);
    std::sort(go.begin(), go.end(), by_rank(gs));
    allowed.assign(e, false);
    for (int32_t i = 0; i < a.group_topk; ++i)
      for (int64_t j = 0; j < per; ++j) allowed[go[i] * per + j] = true;
  }
  std::stable_sort(order.begin(), order.end(), by_rank(sel));
  ids->clear();
  for (int64_t i : order)
    if (allowed[i] && static_cast<int64_t>(ids->size()) < k) ids->push_back(static_cast<int32_t>(i));
  probs->assign(k, 0);
  double norm = 0;
  for (int64_t j = 0; j < k; ++j)
    norm += a.score == 0 && !a.pre_softmax ? std::exp(l[(*ids)[j]] - l[(*ids)[0]]) : s[(*ids)[j]];
  for (int64_t j = 0; j < k; ++j) {
    double p = a.score == 0 && !a.pre_softmax ? std::exp(l[(*ids)[j]] - l[(*ids)[0]]) / norm
               : a.score == 1 && k > 1        ? s[(*ids)[j]] / (norm + 1e-20)
                                              : s[(*ids)[j]];
    (*probs)[j] = p * (a.scaling_factor == 0 ? 1 : a.scaling_factor);
  }
}

struct TopkCase {
  ops::MoeTopkAttrs attrs;
  bool bias;
};

std::vector<TopkCase> topk_cases() {
  return {{{2, 0, 0, 1, 1, 0.0f}, false}, {{1, 0, 1, 1, 1, 0.0f}, false},
          {{3, 0, 1, 1, 1, 1.0f}, false}, {{2, 1, 0, 1, 1, 0.0f}, false},
          {{1, 1, 0, 1, 1, 0.0f}, true},  {{4, 1, 0, 4, 2, 2.5f}, true},
          {{2, 0, 0, 2, 1, 0.0f}, false}, {{8, 1, 0, 1, 1, 1.0f}, false}};
}

std::string describe(const ops::MoeTopkAttrs& a, bool bias) {
  return "k " + std::to_string(a.k) + (a.score ? " sigmoid" : " softmax") +
         (a.pre_softmax ? " pre" : "") + " groups " + std::to_string(a.num_groups) + "/" +
         std::to_string(a.group_topk) + (bias ? " bias" : "");
}

TEST(MoeTopk, MatchesASortedChoiceWithTiesToTheLowerExpert) {
  std::mt19937 rng(6);
  const int64_t n = 9, e = 8;
  for (const TopkCase& c : topk_cases())
    for (bool ties : {false, true}) {
      // Integer logits tie often; ties must go to the lower expert (and group) id.
      Tensor logits = Tensor::random(DType::kF32, {n, e}, rng, -3, 3);
      if (ties)
        for (int64_t i = 0; i < logits.numel(); ++i) logits.set(i, std::round(logits.get(i)));
      Tensor bias = c.bias ? Tensor::random(DType::kF32, {e}, rng, -0.3, 0.3) : Tensor();
      Tensor probs(DType::kF32, {n, c.attrs.k}), ids(DType::kI32, {n, c.attrs.k});
      Tensor lse(DType::kF32, {n});
      run_ref(ops::kMoeTopk, DType::kF32, {&logits, &bias}, {&probs, &ids, &lse}, &c.attrs);
      std::vector<double> ep, el;
      std::vector<int32_t> ei, all_ids;
      std::vector<double> all_probs;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> row(e), b;
        for (int64_t i = 0; i < e; ++i) row[i] = logits.get(t * e + i);
        if (c.bias)
          for (int64_t i = 0; i < e; ++i) b.push_back(bias.get(i));
        std::vector<double> p;
        std::vector<int32_t> id;
        expected_topk(row, b, c.attrs, &p, &id);
        all_probs.insert(all_probs.end(), p.begin(), p.end());
        all_ids.insert(all_ids.end(), id.begin(), id.end());
        double mx = *std::max_element(row.begin(), row.end()), z = 0;
        for (double v : row) z += std::exp(v - mx);
        el.push_back(mx + std::log(z));
      }
      const std::string what = describe(c.attrs, c.bias) + (ties ? " with ties" : "");
      std::vector<double> got_ids = ids.values();
      for (size_t i = 0; i < all_ids.size(); ++i)
        ASSERT_EQ(static_cast<int32_t>(got_ids[i]), all_ids[i]) << what << ": choice " << i;
      expect_close(probs, all_probs, DType::kF32, what + " probs");
      expect_close(lse, el, DType::kF32, what + " lse");
      std::vector<Tensor> in = {logits, bias}, out = {Tensor(DType::kF32, {n, c.attrs.k}),
                                                      Tensor(DType::kI32, {n, c.attrs.k}),
                                                      Tensor(DType::kF32, {n})};
      for (auto* b : ::loom::kernels::testing::device_backends())
        expect_device_matches(*b, ops::kMoeTopk, DType::kF32, in, out, {probs, ids, lse}, &c.attrs,
                              what);
    }
}

// moe_topk_bwd on logits of `dtype` against central differences (step `step`) of moe_topk's
// probs and lse weighted by random w, over well-separated logits (sums of two apart too, for
// group scores): a finite step must not change the choice. Then the other kernels: every
// device's at f32, cpu.fast's and every device's at f64.
void expect_topk_bwd_matches_finite_differences(DType dtype, uint64_t seed, double step,
                                                const Tolerance& tolerance) {
  std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
  const int64_t n = 5, e = 8;
  for (const TopkCase& c : topk_cases()) {
    Tensor logits(dtype, {n, e});
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int64_t> perm(e);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t i = 0; i < e; ++i) {
        const double r = static_cast<double>(perm[i]);
        logits.set(t * e + i, 0.35 * r + 0.013 * r * r - 1.5);
      }
    }
    Tensor bias = c.bias ? Tensor::filled(DType::kF32, {e}, 0.0) : Tensor();
    const int64_t k = c.attrs.k;
    Tensor probs(dtype, {n, k}), ids(DType::kI32, {n, k}), lse(dtype, {n});
    auto forward = [&] {
      run_ref(ops::kMoeTopk, dtype, {&logits, &bias}, {&probs, &ids, &lse}, &c.attrs);
      std::vector<double> v = probs.values(), l = lse.values();
      v.insert(v.end(), l.begin(), l.end());
      return v;
    };
    std::vector<double> w = random_weights(static_cast<size_t>(n * k + n), rng);
    std::vector<double> numeric = numeric_grad(logits, w, forward, step);
    forward();
    Tensor dprobs(dtype, {n, k}), dlse(dtype, {n}), dlogits(dtype, {n, e});
    for (int64_t i = 0; i < n * k; ++i) dprobs.set(i, w[i]);
    for (int64_t i = 0; i < n; ++i) dlse.set(i, w[n * k + i]);
    run_ref(ops::kMoeTopkBwd, dtype, {&dprobs, &logits, &ids, &dlse}, {&dlogits}, &c.attrs);
    const std::string what = std::string(dtype_name(dtype)) + " " + describe(c.attrs, c.bias);
    report_error(dlogits.values(), numeric, what + " dlogits vs finite differences");
    expect_close(dlogits.values(), numeric, tolerance, what + " dlogits");
    std::vector<Tensor> in = {dprobs, logits, ids, dlse}, out = {Tensor(dtype, {n, e})};
    if (dtype == DType::kF64) {
      expect_fast_matches_ref(ops::kMoeTopkBwd, dtype, in, out, &c.attrs, what);
      continue;
    }
    for (auto* b : ::loom::kernels::testing::device_backends())
      expect_device_matches(*b, ops::kMoeTopkBwd, dtype, in, out, {dlogits}, &c.attrs, what);
  }
}

TEST(MoeTopk, BackwardMatchesFiniteDifferences) {
  expect_topk_bwd_matches_finite_differences(DType::kF32, 7, 1e-3, fd_tolerance());
}

// ---- moe_topk / moe_topk_bwd on f64 logits (the fp64 router) -----------------------------

// Random f64 logits (N, E) with full 53-bit mantissas; `ties`: integers (ties often); row 0
// then holds logits closer together than f32 can tell apart (0.5 + i * 1e-12, E - 1 - i in
// the odd columns), which f64 ranks by value.
Tensor f64_logits(int64_t n, int64_t e, bool ties, std::mt19937& rng) {
  Tensor l = Tensor::random(DType::kF64, {n, e}, rng, -3, 3);
  if (ties)
    for (int64_t i = 0; i < l.numel(); ++i) l.set(i, std::round(l.get(i)));
  else
    for (int64_t i = 0; i < e; ++i)
      l.set(i, 0.5 + static_cast<double>(i % 2 ? e - 1 - i : i) * 1e-12);
  return l;
}

TEST(MoeTopkF64, MatchesASortedChoiceInF64) {
  std::mt19937 rng(16);
  const int64_t n = 9, e = 8;
  for (const TopkCase& c : topk_cases())
    for (bool ties : {false, true}) {
      Tensor logits = f64_logits(n, e, ties, rng);
      Tensor bias = c.bias ? Tensor::random(DType::kF32, {e}, rng, -0.3, 0.3) : Tensor();
      Tensor probs(DType::kF64, {n, c.attrs.k}), ids(DType::kI32, {n, c.attrs.k});
      Tensor lse(DType::kF64, {n});
      run_ref(ops::kMoeTopk, DType::kF64, {&logits, &bias}, {&probs, &ids, &lse}, &c.attrs);
      std::vector<double> all_probs, el;
      std::vector<int32_t> all_ids;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> row(e), b;
        for (int64_t i = 0; i < e; ++i) row[i] = logits.get(t * e + i);
        if (c.bias)
          for (int64_t i = 0; i < e; ++i) b.push_back(bias.get(i));
        std::vector<double> p;
        std::vector<int32_t> id;
        expected_topk(row, b, c.attrs, &p, &id);
        all_probs.insert(all_probs.end(), p.begin(), p.end());
        all_ids.insert(all_ids.end(), id.begin(), id.end());
        double mx = *std::max_element(row.begin(), row.end()), z = 0;
        for (double v : row) z += std::exp(v - mx);
        el.push_back(mx + std::log(z));
      }
      const std::string what = "f64 " + describe(c.attrs, c.bias) + (ties ? " with ties" : "");
      std::vector<double> got_ids = ids.values();
      for (size_t i = 0; i < all_ids.size(); ++i)
        ASSERT_EQ(static_cast<int32_t>(got_ids[i]), all_ids[i]) << what << ": choice " << i;
      report_error(probs.values(), all_probs, what + " probs");
      report_error(lse.values(), el, what + " lse");
      expect_close(probs, all_probs, DType::kF64, what + " probs");
      expect_close(lse, el, DType::kF64, what + " lse");
      // cpu.fast (the same rows over threads) gives the same bits; every device, at f64's
      // tolerance.
      std::vector<Tensor> in = {logits, bias}, out = {Tensor(DType::kF64, {n, c.attrs.k}),
                                                      Tensor(DType::kI32, {n, c.attrs.k}),
                                                      Tensor(DType::kF64, {n})};
      expect_fast_matches_ref(ops::kMoeTopk, DType::kF64, in, out, &c.attrs, what);
    }
}

TEST(MoeTopkF64, BackwardMatchesFiniteDifferences) {
  // f64 central differences: step 1e-5, truncation ~1e-10, rounding ~1e-16 / 1e-5 = 1e-11.
  expect_topk_bwd_matches_finite_differences(DType::kF64, 17, 1e-5, Tolerance{1e-7, 1e-8});
}

TEST(MoeTopkF64, TensorsOfAnotherDtypeAreRefused) {
  Tensor logits(DType::kF64, {2, 4}), none, probs(DType::kF32, {2, 2}), ids(DType::kI32, {2, 2});
  ops::MoeTopkAttrs at{2, 0, 0, 1, 1, 0.0f};
  Status s = call_kernel(ops::kMoeTopk, "cpu.ref", DType::kF64, {&logits, &none},
                         {&probs, &ids, &none}, &at);
  EXPECT_EQ(s.code, Code::kUnimplemented);  // supports declines it
  status_release(&s);
  const KernelDesc& k = kernel(ops::kMoeTopk, DType::kF64, "cpu.ref");
  CallHolder h({&logits, &none}, {&probs, &ids, &none}, &at);
  s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&s),
              ::testing::HasSubstr("moe_topk: output 0 (probs) has dtype f32, expected f64"));
  Tensor dprobs(DType::kF32, {2, 2}), dlogits(DType::kF64, {2, 4});
  const KernelDesc& kb = kernel(ops::kMoeTopkBwd, DType::kF64, "cpu.ref");
  CallHolder hb({&dprobs, &logits, &ids, &none}, {&dlogits}, &at);
  s = kb.fn(&hb.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&s),
              ::testing::HasSubstr("moe_topk_bwd: input 0 (dprobs) has dtype f32, expected f64"));
}

// ---- permute / unpermute ----------------------------------------------------------------

class MoePermuteTest : public ::testing::TestWithParam<DType> {};

TEST_P(MoePermuteTest, RowsGoAndComeBackWeighted) {
  const DType dt = GetParam();
  std::mt19937 rng(8);
  const int64_t n = 6, k = 2, c = 5;
  // Choices of 6 tokens (-1: dropped); rows grouped by expert, tokens ascending.
  std::vector<int32_t> experts = {0, 2, 1, 2, 2, -1, 0, 1, -1, -1, 2, 0};
  std::vector<int32_t> src, row_slots, slot_rows(n * k, -1);
  for (int32_t ex = 0; ex < 3; ++ex)
    for (int64_t s = 0; s < n * k; ++s)
      if (experts[s] == ex) {
        slot_rows[s] = static_cast<int32_t>(src.size());
        src.push_back(static_cast<int32_t>(s / k));
        row_slots.push_back(static_cast<int32_t>(s));
      }
  row_slots.push_back(-1);  // a filler row no slot reads
  src.push_back(3);
  const int64_t m = static_cast<int64_t>(src.size());
  Tensor x = Tensor::random(dt, {n, c}, rng), y(dt, {m, c});
  Tensor src_t = Tensor::i32({m}, src), rows_t = Tensor::i32({n, k}, slot_rows);
  Tensor slots_t = Tensor::i32({m}, row_slots);
  run_ref(ops::kMoePermute, dt, {&x, &src_t}, {&y});
  std::vector<double> ey;
  for (int64_t j = 0; j < m; ++j)
    for (int64_t i = 0; i < c; ++i) ey.push_back(x.get(src[j] * c + i));
  expect_close(y, ey, dt, "permute");

  Tensor w = Tensor::random(DType::kF32, {n, k}, rng), out(dt, {n, c});
  run_ref(ops::kMoeUnpermute, dt, {&y, &rows_t, &w}, {&out});
  std::vector<double> eo(static_cast<size_t>(n * c), 0.0);
  for (int64_t s = 0; s < n * k; ++s)
    if (slot_rows[s] >= 0)
      for (int64_t i = 0; i < c; ++i) eo[(s / k) * c + i] += w.get(s) * y.get(slot_rows[s] * c + i);
  expect_close(out, eo, dt, "unpermute");

  Tensor dx = Tensor::random(dt, {n, c}, rng), dy(dt, {m, c}), dw(DType::kF32, {n, k});
  run_ref(ops::kMoeUnpermuteBwd, dt, {&dx, &y, &rows_t, &w, &slots_t}, {&dy, &dw});
  std::vector<double> edy(static_cast<size_t>(m * c), 0.0), edw(static_cast<size_t>(n * k), 0.0);
  for (int64_t j = 0; j < m; ++j)
    if (row_slots[j] >= 0)
      for (int64_t i = 0; i < c; ++i) edy[j * c + i] = w.get(row_slots[j]) * dx.get(row_slots[j] / k * c + i);
  for (int64_t s = 0; s < n * k; ++s)
    if (slot_rows[s] >= 0)
      for (int64_t i = 0; i < c; ++i) edw[s] += dx.get((s / k) * c + i) * y.get(slot_rows[s] * c + i);
  expect_close(dy, edy, dt, "unpermute_bwd dY");
  expect_close(dw.values(), edw, tolerance(dt), "unpermute_bwd dweights");

  std::vector<Tensor> pin = {x, src_t}, uin = {y, rows_t, w}, bin = {dx, y, rows_t, w, slots_t};
  for (auto* b : ::loom::kernels::testing::device_backends()) {
    expect_device_matches<NoAttrs>(*b, ops::kMoePermute, dt, pin, {Tensor(dt, {m, c})}, {y},
                                   nullptr, "permute");
    expect_device_matches<NoAttrs>(*b, ops::kMoeUnpermute, dt, uin, {Tensor(dt, {n, c})}, {out},
                                   nullptr, "unpermute");
    expect_device_matches<NoAttrs>(*b, ops::kMoeUnpermuteBwd, dt, bin,
                                   {Tensor(dt, {m, c}), Tensor(DType::kF32, {n, k})}, {dy, dw},
                                   nullptr, "unpermute_bwd");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MoePermuteTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

TEST(MoePermuteErrors, IndicesOutsideTheirRangeAreRefused) {
  std::mt19937 rng(9);
  Tensor x = Tensor::random(DType::kF32, {3, 2}, rng), y(DType::kF32, {2, 2});
  Tensor src = Tensor::i32({2}, {0, 3});
  Status s = call_kernel<NoAttrs>(ops::kMoePermute, "cpu.ref", DType::kF32, {&x, &src}, {&y});
  EXPECT_EQ(s.code, Code::kOutOfRange);
  EXPECT_THAT(take_message(&s), ::testing::HasSubstr("moe_permute: src[1] = 3 is outside [0, 3)"));
  Tensor rows = Tensor::i32({3, 1}, {0, -2, 1}), out(DType::kF32, {3, 2}), none;
  s = call_kernel<NoAttrs>(ops::kMoeUnpermute, "cpu.ref", DType::kF32, {&y, &rows, &none},
                           {&out});
  EXPECT_EQ(s.code, Code::kOutOfRange);
  EXPECT_THAT(take_message(&s), ::testing::HasSubstr("slot_rows[1] = -2 is outside [-1, 2)"));
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
