// rope, split_qkv / merge_qkv, swap_axes_12 and embedding: the references against
// computations written here, fast against reference over dtypes, rope_bwd as the adjoint
// of rope_fwd, and ids out of range.
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

class LayoutTest : public ::testing::TestWithParam<DType> {};

Tensor inv_freq(int64_t half, double scale = 1.0) {
  Tensor f(DType::kF32, {half});
  for (int64_t i = 0; i < half; ++i) f.set(i, scale * std::pow(10000.0, -2.0 * i / (2 * half)));
  return f;
}

TEST_P(LayoutTest, RopeReferenceMatchesF64AndFastMatchesReference) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  for (auto [b, t, h, d, rd] : std::vector<std::array<int64_t, 5>>{{1, 1, 1, 2, 2},
                                                                   {2, 7, 3, 8, 8},
                                                                   {1, 33, 2, 18, 16},
                                                                   {2, 5, 1, 7, 4},
                                                                   {1, 3, 2, 6, 0}}) {
    Tensor x = Tensor::random(dt, {b, t, h, d}, rng), freq = inv_freq(rd / 2, 0.5);
    std::vector<int32_t> pos(b * t);
    for (auto& p : pos) p = static_cast<int32_t>(rng() % 300);
    for (bool with_pos : {false, true}) {
      Tensor positions = with_pos ? Tensor::i32({b, t}, pos) : Tensor();
      ops::RopeAttrs at{static_cast<int32_t>(rd)};
      Tensor y(dt, {b, t, h, d});
      run_ref(ops::kRopeFwd, dt, {&x, &positions, &freq}, {&y}, &at);
      std::vector<double> expected(x.numel());
      for (int64_t bt = 0; bt < b * t; ++bt)
        for (int64_t hh = 0; hh < h; ++hh) {
          int64_t base = (bt * h + hh) * d;
          double p = with_pos ? pos[bt] : static_cast<double>(bt % t);
          for (int64_t i = 0; i < d; ++i) expected[base + i] = x.get(base + i);
          for (int64_t i = 0; i < rd / 2; ++i) {
            double a = p * freq.get(i), x1 = x.get(base + i), x2 = x.get(base + i + rd / 2);
            expected[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
            expected[base + i + rd / 2] = x2 * std::cos(a) + x1 * std::sin(a);
          }
        }
      expect_close(y, expected, dt, "rope_fwd");
      expect_fast_matches_ref(ops::kRopeFwd, dt, {x, positions, freq}, {Tensor(dt, {b, t, h, d})},
                              &at);
      expect_fast_matches_ref(ops::kRopeBwd, dt, {x, positions, freq}, {Tensor(dt, {b, t, h, d})},
                              &at);
      // In place (Y aliases X) gives the same.
      for (const char* name : {"cpu.ref", "cpu.fast"}) {
        Tensor xi = x;
        run(ops::kRopeFwd, name, dt, {&xi, &positions, &freq}, {&xi}, &at);
        expect_close(xi, y.values(), dt, std::string("rope in place ") + name);
      }
    }
  }
}

// A rotation's gradient is its transpose: <rope_fwd(x), w> == <x, rope_bwd(w)>.
TEST(RopeGradient, BackwardIsTheAdjointOfForward) {
  std::mt19937 rng(2);
  Tensor x = Tensor::random(DType::kF32, {2, 3, 2, 8}, rng),
         w = Tensor::random(DType::kF32, {2, 3, 2, 8}, rng);
  Tensor freq = inv_freq(3), none, y(DType::kF32, {2, 3, 2, 8}), g(DType::kF32, {2, 3, 2, 8});
  ops::RopeAttrs at{6};
  run_ref(ops::kRopeFwd, DType::kF32, {&x, &none, &freq}, {&y}, &at);
  run_ref(ops::kRopeBwd, DType::kF32, {&w, &none, &freq}, {&g}, &at);
  std::vector<double> fd = numeric_grad(x, w.values(), [&] {
    Tensor out(DType::kF32, {2, 3, 2, 8});
    run_ref(ops::kRopeFwd, DType::kF32, {&x, &none, &freq}, {&out}, &at);
    return out.values();
  });
  expect_close(g.values(), fd, fd_tolerance(), "rope_bwd vs finite differences");
  // And backward undoes forward.
  Tensor back(DType::kF32, {2, 3, 2, 8});
  run_ref(ops::kRopeBwd, DType::kF32, {&y, &none, &freq}, {&back}, &at);
  expect_close(back, x.values(), DType::kF32, "rope_bwd(rope_fwd(x))");
}

TEST_P(LayoutTest, SplitAndMergeQkv) {
  std::mt19937 rng(3);
  DType dt = GetParam();
  for (auto [b, t, h, g, d] : std::vector<std::array<int64_t, 5>>{
           {1, 1, 1, 1, 1}, {2, 7, 4, 2, 3}, {1, 33, 6, 1, 5}, {2, 3, 4, 4, 8}}) {
    int64_t width = (h / g + 2) * d;
    Tensor x = Tensor::random(dt, {b, t, g, width}, rng);
    Tensor q(dt, {b, t, h, d}), k(dt, {b, t, g, d}), v(dt, {b, t, g, d});
    run_ref(ops::kSplitQkv, dt, {&x}, {&q, &k, &v});
    // Group gi holds query heads gi*H/G .. then its key head, then its value head.
    for (int64_t bt = 0; bt < b * t; ++bt)
      for (int64_t gi = 0; gi < g; ++gi)
        for (int64_t i = 0; i < d; ++i) {
          int64_t x0 = (bt * g + gi) * width;
          for (int64_t j = 0; j < h / g; ++j)
            ASSERT_EQ(q.get((bt * h + gi * (h / g) + j) * d + i), x.get(x0 + j * d + i));
          ASSERT_EQ(k.get((bt * g + gi) * d + i), x.get(x0 + (h / g) * d + i));
          ASSERT_EQ(v.get((bt * g + gi) * d + i), x.get(x0 + (h / g + 1) * d + i));
        }
    expect_fast_matches_ref(ops::kSplitQkv, dt, {x}, {q, k, v});
    Tensor back(dt, {b, t, g, width});
    run_ref(ops::kMergeQkv, dt, {&q, &k, &v}, {&back});
    expect_close(back, x.values(), dt, "merge(split(x))");
    expect_fast_matches_ref(ops::kMergeQkv, dt, {q, k, v}, {Tensor(dt, {b, t, g, width})});
  }
}

TEST_P(LayoutTest, SwapAxes12) {
  std::mt19937 rng(4);
  DType dt = GetParam();
  for (auto [a, i, j, d] :
       std::vector<std::array<int64_t, 4>>{{1, 1, 1, 1}, {2, 7, 3, 5}, {3, 33, 4, 8}}) {
    Tensor x = Tensor::random(dt, {a, i, j, d}, rng), y(dt, {a, j, i, d});
    run_ref(ops::kSwapAxes12, dt, {&x}, {&y});
    for (int64_t p = 0; p < a; ++p)
      for (int64_t q = 0; q < i; ++q)
        for (int64_t r = 0; r < j; ++r)
          for (int64_t s = 0; s < d; ++s)
            ASSERT_EQ(y.get(((p * j + r) * i + q) * d + s), x.get(((p * i + q) * j + r) * d + s));
    expect_fast_matches_ref(ops::kSwapAxes12, dt, {x}, {Tensor(dt, {a, j, i, d})});
  }
}

TEST(SwapAxes12, MovesI32AndRefusesAliasing) {
  Tensor x = Tensor::i32({1, 2, 3, 1}, {1, 2, 3, 4, 5, 6}), y(DType::kI32, {1, 3, 2, 1});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    run(ops::kSwapAxes12, name, DType::kI32, {&x}, {&y});
    EXPECT_EQ(y.values(), (std::vector<double>{1, 4, 2, 5, 3, 6})) << name;
  }
  Tensor sq(DType::kF32, {1, 2, 2, 1});
  Status s = call_kernel(ops::kSwapAxes12, "cpu.ref", DType::kF32, {&sq}, {&sq});
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_NE(take_message(&s).find("swap_axes_12: Y must not alias X"), std::string::npos);
}

TEST_P(LayoutTest, EmbeddingForwardAndBackward) {
  std::mt19937 rng(5);
  DType dt = GetParam();
  for (auto [v, c, n] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 33, 20}, {65, 300, 127}}) {
    Tensor table = Tensor::random(dt, {v, c}, rng);
    std::vector<int32_t> idv(n);
    for (auto& id : idv) id = static_cast<int32_t>(rng() % v);  // repeats included
    Tensor ids = Tensor::i32({n}, idv), y(dt, {n, c});
    run_ref(ops::kEmbeddingFwd, dt, {&table, &ids}, {&y});
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c; ++j) ASSERT_EQ(y.get(r * c + j), table.get(idv[r] * c + j));
    expect_fast_matches_ref(ops::kEmbeddingFwd, dt, {table, ids}, {Tensor(dt, {n, c})});
    Tensor dy = Tensor::random(dt, {n, c}, rng), dtable = Tensor::random(DType::kF32, {v, c}, rng);
    expect_fast_matches_ref(ops::kEmbeddingBwd, dt, {dy, ids}, {dtable});
    std::vector<double> expected = dtable.values();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c; ++j) expected[idv[r] * c + j] += dy.get(r * c + j);
    run_ref(ops::kEmbeddingBwd, dt, {&dy, &ids}, {&dtable});
    expect_close(dtable, expected, DType::kF32, "embedding_bwd accumulates");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LayoutTest, ::testing::ValuesIn(float_dtypes()), dtype_param_name);

TEST(EmbeddingErrors, IdOutOfRange) {
  Tensor table(DType::kF32, {5, 2}), ids = Tensor::i32({3}, {0, 5, 1}), y(DType::kF32, {3, 2});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Status s = call_kernel(ops::kEmbeddingFwd, name, DType::kF32, {&table, &ids}, {&y});
    EXPECT_EQ(s.code, Code::kOutOfRange);
    EXPECT_EQ(take_message(&s), "embedding_fwd: ids[1] = 5 is outside [0, 5) (the table's rows)");
  }
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
