// Every collective of comm_backend "gloo" at group sizes 1 to 4, with exact expected values
// (small integers and halves, exact in every dtype).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "tests/plugins/comm_gloo/comm_env.h"

namespace loom::testing {
namespace {

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int size() const { return GetParam(); }
  // A connected group under a key unique to the test.
  Group connect(const std::string& name) {
    Group group = connect_group(size(), name + "/" + std::to_string(size()), store_);
    return group;
  }
  InMemoryStore store_;
};

// Rank r's element i in all_reduce tests: signed, distinct per rank, exact in every dtype
// (u8 gets non-negative values).
double element(DType dtype, int r, size_t i) {
  double v = static_cast<double>((r + 1) * (static_cast<int>(i) + 1));
  if (dtype != DType::kU8 && i % 2 == 1)
    v = -v + 0.5 * (dtype == DType::kI32 || dtype == DType::kI64 ? 0 : 1);
  return v;
}

double reference(DType dtype, ReduceOp op, int size, size_t i) {
  double acc = element(dtype, 0, i);
  for (int r = 1; r < size; ++r) {
    double v = element(dtype, r, i);
    if (op == ReduceOp::kMax)
      acc = std::max(acc, v);
    else if (op == ReduceOp::kMin)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  return op == ReduceOp::kAvg ? acc / size : acc;
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

TEST_P(Collectives, AllReduceEveryDtypeAndOp) {
  Group group = connect("all_reduce");
  ASSERT_FALSE(HasFailure());
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                          DType::kI32, DType::kI64, DType::kU8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
  constexpr size_t kN = 7;  // not a multiple of any group size
  for (DType dtype : dtypes)
    for (ReduceOp op : ops) {
      const bool is_float = dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16 ||
                            dtype == DType::kF16;
      if (op == ReduceOp::kAvg && !is_float) continue;  // rejected: see errors_test
      std::vector<HostTensor> tensors(size(), HostTensor(dtype, kN));
      std::vector<Outcome> outcomes(size());
      run_ranks(size(), [&](int r) {
        for (size_t i = 0; i < kN; ++i) tensors[r].set(i, element(dtype, r, i));
        TensorView v = tensors[r].view();
        outcomes[r] = outcome(group[r].all_reduce(&v, op, nullptr));
      });
      for (int r = 0; r < size(); ++r) {
        ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
        for (size_t i = 0; i < kN; ++i)
          EXPECT_EQ(tensors[r].get(i), reference(dtype, op, size(), i))
              << dtype_name(dtype) << " " << op_name(op) << " rank " << r << " element " << i;
      }
    }
}

TEST_P(Collectives, ReduceScatterEveryOp) {
  Group group = connect("reduce_scatter");
  ASSERT_FALSE(HasFailure());
  constexpr size_t kChunk = 5;  // 3 ranks x 5 elements etc.
  const std::pair<DType, ReduceOp> cases[] = {{DType::kF32, ReduceOp::kSum},
                                              {DType::kF32, ReduceOp::kAvg},
                                              {DType::kBF16, ReduceOp::kMax},
                                              {DType::kI64, ReduceOp::kMin},
                                              {DType::kF16, ReduceOp::kSum}};
  for (auto [dtype, op] : cases) {
    std::vector<HostTensor> inputs(size(), HostTensor(dtype, size() * kChunk));
    std::vector<HostTensor> outputs(size(), HostTensor(dtype, kChunk));
    std::vector<Outcome> outcomes(size());
    // Rank q's input element j: q * 16 + j, its negation at odd j.
    auto value = [](int q, size_t j) {
      double v = q * 16.0 + static_cast<double>(j);
      return j % 2 ? -v : v;
    };
    run_ranks(size(), [&](int r) {
      for (size_t j = 0; j < inputs[r].n; ++j) inputs[r].set(j, value(r, j));
      TensorView in = inputs[r].view(), out = outputs[r].view();
      outcomes[r] = outcome(group[r].reduce_scatter(&in, &out, op, nullptr));
    });
    for (int r = 0; r < size(); ++r) {
      ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
      for (size_t k = 0; k < kChunk; ++k) {
        const size_t j = r * kChunk + k;
        double expected = value(0, j);
        for (int q = 1; q < size(); ++q) {
          double v = value(q, j);
          expected = op == ReduceOp::kMax   ? std::max(expected, v)
                     : op == ReduceOp::kMin ? std::min(expected, v)
                                            : expected + v;
        }
        if (op == ReduceOp::kAvg) expected /= size();
        EXPECT_EQ(outputs[r].get(k), expected)
            << dtype_name(dtype) << " " << op_name(op) << " rank " << r << " element " << k;
      }
    }
  }
}

TEST_P(Collectives, AllGatherOutOfPlaceAndInPlace) {
  Group group = connect("all_gather");
  ASSERT_FALSE(HasFailure());
  constexpr size_t kChunk = 5;
  for (bool in_place : {false, true}) {
    std::vector<HostTensor> inputs(size(), HostTensor(DType::kF32, kChunk));
    std::vector<HostTensor> outputs(size(), HostTensor(DType::kF32, size() * kChunk));
    std::vector<Outcome> outcomes(size());
    run_ranks(size(), [&](int r) {
      TensorView out = outputs[r].view();
      TensorView in = inputs[r].view();
      if (in_place) {  // the input is this rank's chunk of the output (ZeRO's gather)
        in.data = outputs[r].bytes.data() + r * kChunk * sizeof(float);
        for (size_t k = 0; k < kChunk; ++k) outputs[r].set(r * kChunk + k, r * 10.0 + k);
      } else {
        for (size_t k = 0; k < kChunk; ++k) inputs[r].set(k, r * 10.0 + k);
      }
      outcomes[r] = outcome(group[r].all_gather(&in, &out, nullptr));
    });
    for (int r = 0; r < size(); ++r) {
      ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
      for (int q = 0; q < size(); ++q)
        for (size_t k = 0; k < kChunk; ++k)
          EXPECT_EQ(outputs[r].get(q * kChunk + k), q * 10.0 + k)
              << "in_place " << in_place << " rank " << r << " chunk " << q;
    }
  }
}

TEST_P(Collectives, AllGatherOneByteElements) {
  Group group = connect("all_gather_u8");
  ASSERT_FALSE(HasFailure());
  std::vector<HostTensor> inputs(size(), HostTensor(DType::kU8, 1));
  std::vector<HostTensor> outputs(size(), HostTensor(DType::kU8, size()));
  std::vector<Outcome> outcomes(size());
  run_ranks(size(), [&](int r) {
    inputs[r].set(0, 200 + r);
    TensorView in = inputs[r].view(), out = outputs[r].view();
    outcomes[r] = outcome(group[r].all_gather(&in, &out, nullptr));
  });
  for (int r = 0; r < size(); ++r) {
    ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
    for (int q = 0; q < size(); ++q) EXPECT_EQ(outputs[r].get(q), 200 + q);
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  Group group = connect("broadcast");
  ASSERT_FALSE(HasFailure());
  constexpr size_t kN = 9;
  for (int root = 0; root < size(); ++root) {
    std::vector<HostTensor> tensors(size(), HostTensor(DType::kBF16, kN));
    std::vector<Outcome> outcomes(size());
    run_ranks(size(), [&](int r) {
      for (size_t i = 0; i < kN; ++i) tensors[r].set(i, r == root ? root * 7.0 + i : -1.0);
      TensorView v = tensors[r].view();
      outcomes[r] = outcome(group[r].broadcast(&v, root, nullptr));
    });
    for (int r = 0; r < size(); ++r) {
      ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
      for (size_t i = 0; i < kN; ++i)
        EXPECT_EQ(tensors[r].get(i), root * 7.0 + i) << "root " << root << " rank " << r;
    }
  }
}

// Rank r sends count(r, p) elements to p: unequal, some zero.
int64_t count(int r, int p) { return (r + 2 * p) % 3 + (r == p ? 1 : 0); }
double message(int from, int to, int64_t k) { return 1000.0 * from + 100.0 * to + k; }

TEST_P(Collectives, AllToAllUnequalCountsPackedAndScattered) {
  Group group = connect("all_to_all");
  ASSERT_FALSE(HasFailure());
  for (bool scattered : {false, true}) {
    std::vector<HostTensor> inputs, outputs;
    std::vector<std::vector<int64_t>> sc(size()), so(size()), rc(size()), ro(size());
    for (int r = 0; r < size(); ++r) {
      int64_t at_send = 0, at_recv = 0;
      // Scattered: one element of padding before each slice, slices in reverse rank order.
      for (int i = 0; i < size(); ++i) {
        int p = scattered ? size() - 1 - i : i;
        sc[r].resize(size());
        so[r].resize(size());
        rc[r].resize(size());
        ro[r].resize(size());
        at_send += scattered ? 1 : 0;
        at_recv += scattered ? 1 : 0;
        sc[r][p] = count(r, p);
        so[r][p] = at_send;
        at_send += sc[r][p];
        rc[r][p] = count(p, r);
        ro[r][p] = at_recv;
        at_recv += rc[r][p];
      }
      inputs.emplace_back(DType::kI32, static_cast<size_t>(at_send));
      outputs.emplace_back(DType::kI32, static_cast<size_t>(at_recv));
      for (int p = 0; p < size(); ++p)
        for (int64_t k = 0; k < sc[r][p]; ++k) inputs[r].set(so[r][p] + k, message(r, p, k));
      for (size_t j = 0; j < outputs[r].n; ++j) outputs[r].set(j, -7);
    }
    std::vector<Outcome> outcomes(size());
    run_ranks(size(), [&](int r) {
      TensorView in = inputs[r].view(), out = outputs[r].view();
      outcomes[r] = outcome(group[r].all_to_all(&in, sc[r].data(), so[r].data(), &out, rc[r].data(),
                                                ro[r].data(), nullptr));
    });
    for (int r = 0; r < size(); ++r) {
      ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
      std::vector<double> expected(outputs[r].n, -7);
      for (int p = 0; p < size(); ++p)
        for (int64_t k = 0; k < rc[r][p]; ++k) expected[ro[r][p] + k] = message(p, r, k);
      EXPECT_EQ(outputs[r].values(), expected) << "scattered " << scattered << " rank " << r;
    }
  }
}

TEST_P(Collectives, BarrierWaitsForEveryRank) {
  Group group = connect("barrier");
  ASSERT_FALSE(HasFailure());
  std::atomic<int> arrived{0};
  std::vector<int> seen(size());
  std::vector<Outcome> outcomes(size());
  run_ranks(size(), [&](int r) {
    if (r == size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived++;
    outcomes[r] = outcome(group[r].barrier());
    seen[r] = arrived.load();
  });
  for (int r = 0; r < size(); ++r) {
    ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
    EXPECT_EQ(seen[r], size()) << "rank " << r << " left the barrier early";
  }
}

TEST_P(Collectives, RankAndSize) {
  Group group = connect("rank_size");
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < size(); ++r) {
    EXPECT_EQ(group[r].rank(), r);
    EXPECT_EQ(group[r].size(), size());
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, Collectives, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "size" + std::to_string(info.param); });

// bf16 and f16 sums are made in f32 per pair and rounded to nearest even.
TEST(Rounding, HalfPrecisionSumsRoundToNearestEven) {
  InMemoryStore store;
  Group group = connect_group(2, "rounding", store);
  ASSERT_FALSE(HasFailure());
  struct Case {
    DType dtype;
    double other;     // rank 1's value; rank 0 holds 1.0
    double expected;  // 1 + other rounded to nearest even
  };
  const Case cases[] = {
      {DType::kBF16, std::ldexp(1.0, -8), 1.0},                            // tie: down to even
      {DType::kBF16, 3 * std::ldexp(1.0, -8), 1.0 + std::ldexp(1.0, -6)},  // tie: up to even
      {DType::kF16, std::ldexp(1.0, -11), 1.0},
      {DType::kF16, 3 * std::ldexp(1.0, -11), 1.0 + std::ldexp(1.0, -9)},
  };
  for (const Case& c : cases) {
    std::vector<HostTensor> tensors(2, HostTensor(c.dtype, 3));
    std::vector<Outcome> outcomes(2);
    run_ranks(2, [&](int r) {
      for (size_t i = 0; i < 3; ++i) tensors[r].set(i, r == 0 ? 1.0 : c.other);
      TensorView v = tensors[r].view();
      outcomes[r] = outcome(group[r].all_reduce(&v, ReduceOp::kSum, nullptr));
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(outcomes[r].code, Code::kOk) << outcomes[r].message;
      for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(tensors[r].get(i), c.expected) << dtype_name(c.dtype) << " + " << c.other;
    }
  }
}

// The default hostname (empty: this machine's name if it resolves off loopback, else
// 127.0.0.1) connects ranks of one machine.
TEST(DefaultHostname, Connects) {
  InMemoryStore store;
  Group group = connect_group(2, "default_host", store, {{"impl", "gloo"}});
  ASSERT_FALSE(HasFailure());
  std::vector<Outcome> outcomes(2);
  run_ranks(2, [&](int r) { outcomes[r] = outcome(group[r].barrier()); });
  for (const Outcome& o : outcomes) EXPECT_EQ(o.code, Code::kOk) << o.message;
}

// "interface" picks the listening address from a network interface (lo is everywhere).
TEST(Interface, LoopbackConnects) {
  InMemoryStore store;
  Group group = connect_group(2, "iface", store, {{"impl", "gloo"}, {"interface", "lo"}});
  ASSERT_FALSE(HasFailure());
  std::vector<Outcome> outcomes(2);
  run_ranks(2, [&](int r) { outcomes[r] = outcome(group[r].barrier()); });
  for (const Outcome& o : outcomes) EXPECT_EQ(o.code, Code::kOk) << o.message;
}

// Two groups of the same ranks, as a grid's tp and dp groups, used concurrently.
TEST(Groups, TwoGroupsShareOneBackendPerRank) {
  InMemoryStore store;
  std::vector<ObjectPtr> backends;
  for (int r = 0; r < 2; ++r) backends.push_back(make_backend());
  std::vector<CommPtr> a(2), b(2);
  std::vector<Outcome> outcomes(4);
  run_ranks(2, [&](int r) {
    ICommunicator* raw = nullptr;
    outcomes[r] =
        outcome(as_backend(backends[r])
                    ->create_communicator(&store, {"tp/0", 4}, r, 2, DeviceType::kCpu, &raw));
    a[r].reset(raw);
    outcomes[2 + r] =
        outcome(as_backend(backends[r])
                    ->create_communicator(&store, {"dp/0", 4}, r, 2, DeviceType::kCpu, &raw));
    b[r].reset(raw);
  });
  for (const Outcome& o : outcomes) ASSERT_EQ(o.code, Code::kOk) << o.message;
  std::vector<HostTensor> x(2, HostTensor(DType::kF32, 4)), y(2, HostTensor(DType::kF32, 4));
  run_ranks(4, [&](int t) {  // threads 0, 1 drive group a; 2, 3 group b
    int r = t % 2;
    HostTensor& mine = t < 2 ? x[r] : y[r];
    for (size_t i = 0; i < 4; ++i) mine.set(i, (t < 2 ? 1.0 : 10.0) * (r + 1));
    TensorView v = mine.view();
    outcomes[t] = outcome((t < 2 ? a[r] : b[r])->all_reduce(&v, ReduceOp::kSum, nullptr));
  });
  for (const Outcome& o : outcomes) ASSERT_EQ(o.code, Code::kOk) << o.message;
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(x[r].get(i), 3.0);
      EXPECT_EQ(y[r].get(i), 30.0);
    }
}

}  // namespace
}  // namespace loom::testing
