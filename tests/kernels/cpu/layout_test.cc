// rope, split_qkv / merge_qkv, swap_axes_12 and embedding: the references against
// computations written here, fast against reference over dtypes, rope_bwd as the adjoint
// of rope_fwd, ids out of range, and vocab-parallel embedding shards (EmbeddingAttrs)
// against the whole table.
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

// Vocab-parallel: P tables of uneven row ranges, each called with EmbeddingAttrs. The
// forward outputs sum to the whole table's (each id is in exactly one shard, the others
// give zero rows) and each backward accumulates exactly its rows of the whole backward.
TEST_P(LayoutTest, EmbeddingShardsSumToTheWholeTable) {
  std::mt19937 rng(6);
  DType dt = GetParam();
  for (auto [v, c, n] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 3}, {7, 33, 20}, {65, 300, 127}}) {
    Tensor table = Tensor::random(dt, {v, c}, rng);
    std::vector<int32_t> idv(n);
    for (auto& id : idv) id = static_cast<int32_t>(rng() % v);
    Tensor ids = Tensor::i32({n}, idv), y(dt, {n, c});
    Tensor dy = Tensor::random(dt, {n, c}, rng), dtable0 = Tensor::random(DType::kF32, {v, c}, rng);
    Tensor dtable = dtable0;
    run_ref(ops::kEmbeddingFwd, dt, {&table, &ids}, {&y});
    run_ref(ops::kEmbeddingBwd, dt, {&dy, &ids}, {&dtable});
    for (int64_t p : {1, 2, 3}) {
      std::vector<int64_t> b = uneven_split(v, p);
      std::vector<double> sum(static_cast<size_t>(n * c), 0.0);
      for (int64_t k = 0; k < p; ++k) {
        int64_t rows = b[k + 1] - b[k];
        std::string what =
            "shard " + std::to_string(k) + " of " + std::to_string(p) + ", V " + std::to_string(v);
        ops::EmbeddingAttrs at{b[k], v};
        Tensor part(dt, {rows, c}), part_grad(DType::kF32, {rows, c});
        for (int64_t i = 0; i < rows * c; ++i) {
          part.set(i, table.get(b[k] * c + i));
          part_grad.set(i, dtable0.get(b[k] * c + i));
        }
        Tensor yk(dt, {n, c});
        run_ref(ops::kEmbeddingFwd, dt, {&part, &ids}, {&yk}, &at);
        for (int64_t i = 0; i < n * c; ++i) sum[i] += yk.get(i);
        expect_fast_matches_ref(ops::kEmbeddingFwd, dt, {part, ids}, {Tensor(dt, {n, c})}, &at,
                                what);
        expect_fast_matches_ref(ops::kEmbeddingBwd, dt, {dy, ids}, {part_grad}, &at, what);
        run_ref(ops::kEmbeddingBwd, dt, {&dy, &ids}, {&part_grad}, &at);
        std::vector<double> whole = dtable.values(),
                            expected(whole.begin() + b[k] * c, whole.begin() + b[k + 1] * c);
        expect_close(part_grad, expected, DType::kF32, "embedding_bwd " + what);
      }
      expect_close(
          sum, y.values(), tolerance(dt),
          "sum of embedding_fwd over " + std::to_string(p) + " shards, V " + std::to_string(v));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LayoutTest, ::testing::ValuesIn(float_dtypes()), dtype_param_name);

TEST(EmbeddingShards, IdsOutsideTheVocabularyAreAnErrorOthersOutsideTheShardAreNot) {
  // Rows [3, 5) of a vocabulary of 5.
  ops::EmbeddingAttrs at{3, 5};
  Tensor table = Tensor::filled(DType::kF32, {2, 2}, 1.0), y(DType::kF32, {3, 2});
  Tensor dy = Tensor::filled(DType::kF32, {3, 2}, 1.0), dtable(DType::kF32, {2, 2});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    for (int32_t bad : {5, -1}) {
      Tensor ids = Tensor::i32({3}, {0, bad, 4});
      Status s = call_kernel(ops::kEmbeddingFwd, name, DType::kF32, {&table, &ids}, {&y}, &at);
      EXPECT_EQ(s.code, Code::kOutOfRange) << name;
      EXPECT_EQ(take_message(&s), "embedding_fwd: ids[1] = " + std::to_string(bad) +
                                      " is outside [0, 5) (the vocabulary; this table holds "
                                      "its rows [3, 5))");
      s = call_kernel(ops::kEmbeddingBwd, name, DType::kF32, {&dy, &ids}, {&dtable}, &at);
      EXPECT_EQ(s.code, Code::kOutOfRange) << name;
      EXPECT_NE(take_message(&s).find("embedding_bwd: ids[1] = "), std::string::npos);
    }
    Tensor ids = Tensor::i32({3}, {0, 3, 4});  // 0: another shard's row
    y = Tensor::filled(DType::kF32, {3, 2}, 7.0);
    run(ops::kEmbeddingFwd, name, DType::kF32, {&table, &ids}, {&y}, &at);
    EXPECT_EQ(y.values(), (std::vector<double>{0, 0, 1, 1, 1, 1})) << name;
    dtable = Tensor(DType::kF32, {2, 2});
    run(ops::kEmbeddingBwd, name, DType::kF32, {&dy, &ids}, {&dtable}, &at);
    EXPECT_EQ(dtable.values(), (std::vector<double>{1, 1, 1, 1})) << name;
  }
}

// A vocabulary of 5 padded to 12 rows over 3 shards of 4 (Megatron's layout): shard 1 holds
// rows [4, 8), of which [5, 8) padding, shard 2 padding whole. Ids are checked against the
// vocabulary, so the padding is never read or written; the shards sum to the unpadded table.
TEST(EmbeddingShards, PaddingRowsAreNeverReached) {
  Tensor ids = Tensor::i32({4}, {4, 0, 3, 4}), dy = Tensor::filled(DType::kF32, {4, 2}, 1.0);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    std::vector<double> sum(8, 0.0);
    for (int64_t k = 0; k < 3; ++k) {
      ops::EmbeddingAttrs at{4 * k, 5};
      Tensor table(DType::kF32, {4, 2}), y(DType::kF32, {4, 2}), dtable(DType::kF32, {4, 2});
      for (int64_t i = 0; i < 8; ++i) table.set(i, 10.0 * (4 * k + i / 2) + i % 2);
      run(ops::kEmbeddingFwd, name, DType::kF32, {&table, &ids}, {&y}, &at);
      for (int64_t i = 0; i < 8; ++i) sum[i] += y.get(i);
      run(ops::kEmbeddingBwd, name, DType::kF32, {&dy, &ids}, {&dtable}, &at);
      // Row 4 (shard 1's row 0) is looked up twice; padding rows get nothing.
      std::vector<double> expected(8, 0.0);
      if (k == 0) expected = {1, 1, 0, 0, 0, 0, 1, 1};
      if (k == 1) expected = {2, 2, 0, 0, 0, 0, 0, 0};
      EXPECT_EQ(dtable.values(), expected) << name << " shard " << k;
      Tensor bad = Tensor::i32({1}, {5}), row(DType::kF32, {1, 2});
      Status s = call_kernel(ops::kEmbeddingFwd, name, DType::kF32, {&table, &bad}, {&row}, &at);
      EXPECT_EQ(s.code, Code::kOutOfRange) << name << " shard " << k;
      take_message(&s);
    }
    EXPECT_EQ(sum, (std::vector<double>{40, 41, 0, 1, 30, 31, 40, 41})) << name;
  }
}

TEST(EmbeddingShards, BadAttrsAreRefused) {
  Tensor table(DType::kF32, {2, 2}), ids = Tensor::i32({1}, {0}), y(DType::kF32, {1, 2});
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    const KernelDesc& k = kernel(ops::kEmbeddingFwd, DType::kF32, name);
    // ({4, 5} and {0, 1} place table rows in the padding after the vocabulary: allowed.)
    for (ops::EmbeddingAttrs at : {ops::EmbeddingAttrs{-1, 5}, ops::EmbeddingAttrs{0, -1}}) {
      CallHolder h({&table, &ids}, {&y}, &at);
      EXPECT_FALSE(k.supports(&h.call)) << name;
      Status s = k.fn(&h.call);
      EXPECT_EQ(s.code, Code::kInvalidArgument);
      EXPECT_EQ(take_message(&s), "embedding_fwd: attrs vocab_start = " +
                                      std::to_string(at.vocab_start) + ", vocab_size = " +
                                      std::to_string(at.vocab_size) + ": both must be >= 0");
    }
    // An attrs struct of the wrong size.
    ops::RopeAttrs wrong{0};
    CallHolder h({&table, &ids}, {&y}, &wrong);
    EXPECT_FALSE(k.supports(&h.call)) << name;
    Status s = k.fn(&h.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument);
    EXPECT_NE(take_message(&s).find("embedding_fwd: attrs must point to the op's attributes "
                                    "struct of 16 bytes (got attrs_size 4)"),
              std::string::npos);
  }
}

TEST(EmbeddingShards, SupportsAcceptsCallsWithAndWithoutAttrs) {
  // Shapes only (null data), as find_kernel asks.
  Tensor table(DType::kBF16, {4, 8}), ids(DType::kI32, {3}), y(DType::kBF16, {3, 8}),
      dtable(DType::kF32, {4, 8});
  ops::EmbeddingAttrs at{4, 8};
  for (const char* op : {ops::kEmbeddingFwd, ops::kEmbeddingBwd}) {
    bool bwd = std::string(op) == ops::kEmbeddingBwd;
    std::vector<Tensor*> in = {bwd ? &y : &table, &ids}, out = {bwd ? &dtable : &y};
    CallHolder plain(in, out, static_cast<const NoAttrs*>(nullptr)), sharded(in, out, &at);
    for (CallHolder* h : {&plain, &sharded}) {
      for (TensorView& v : h->in) v.data = nullptr;
      for (TensorView& v : h->out) v.data = nullptr;
      for (const char* name : {"cpu.ref", "cpu.fast"})
        EXPECT_TRUE(kernel(op, DType::kBF16, name).supports(&h->call)) << op << " " << name;
    }
  }
}

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
