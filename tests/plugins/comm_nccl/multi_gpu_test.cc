// comm_backend "nccl" over every GPU of the machine (at most 8): one rank per GPU, each a
// thread of this process with its own backend, meeting through an in-memory rendezvous
// store. The values are checked against sums, extremes and layouts computed here; a rank that
// never joins an all-reduce makes the others time out and abort instead of hanging. Skipped
// (with "[cuda] skipped: ...") on machines with fewer than two GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "loom/cpp/comm_work.h"
#include "tests/plugins/comm_nccl/nccl_env.h"

namespace loom::testing {
namespace {

using Clock = std::chrono::steady_clock;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

int ranks() {
  std::string reason;
  return std::min(cuda_devices(&reason), 8);
}

// The ranks of one group: backends made on the test thread, communicators made
// concurrently on the rank threads, each with its GPU current.
struct NcclGroup {
  std::vector<ObjectPtr> backends;  // destroyed after the communicators
  std::vector<CommPtr> comms;
  ICommunicator& operator[](int r) { return *comms[r]; }
};

NcclGroup connect(int n, const std::string& key, InMemoryStore& store, bool blocking_wait) {
  NcclGroup g;
  for (int r = 0; r < n; ++r)
    g.backends.push_back(make_nccl_backend({{"impl", "nccl"}, {"blocking_wait", blocking_wait}}));
  g.comms.resize(n);
  std::vector<Outcome> outcomes(n);
  run_ranks(n, [&](int r) {
    cuda_ok(cudaSetDevice(r), "cudaSetDevice");
    ICommunicator* raw = nullptr;
    outcomes[r] = outcome(
        interface_cast<ICommBackend>(g.backends[r].get())
            ->create_communicator(&store, {key.data(), key.size()}, r, n, DeviceType::kCuda, &raw));
    g.comms[r].reset(raw);
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(outcomes[r].code, Code::kOk) << "rank " << r << ": " << outcomes[r].message;
  return g;
}

// Runs fn(rank) on every rank's thread with that rank's GPU current.
void on_gpus(int n, const std::function<void(int)>& fn) {
  run_ranks(n, [&](int r) {
    cuda_ok(cudaSetDevice(r), "cudaSetDevice");
    fn(r);
  });
}

bool floating(DType d) {
  return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16 || d == DType::kF16;
}

// Rank r's element j: small integers, exact in every dtype, different per rank.
double value(int r, size_t j) { return (r + 1) * static_cast<double>(j % 5 + 1); }

class MultiGpu : public ::testing::Test {
 protected:
  void SetUp() override { LOOM_NEED_GPUS(2); }
  InMemoryStore store_;
};

TEST_F(MultiGpu, AllReduceEveryDtypeAndOp) {
  const int n = ranks();
  NcclGroup g = connect(n, "all_reduce", store_, false);
  ASSERT_FALSE(HasFailure());
  constexpr size_t kLength = 1000;
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                      DType::kU8}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      if (op == ReduceOp::kAvg && !floating(dtype)) continue;
      std::vector<std::vector<double>> got(n);
      on_gpus(n, [&](int r) {
        HostTensor in(dtype, kLength);
        for (size_t j = 0; j < kLength; ++j) in.set(j, value(r, j));
        DeviceTensor t(dtype, kLength);
        t.upload(in);
        TensorView v = t.view();
        Outcome o = outcome(g[r].all_reduce(&v, op, nullptr));
        EXPECT_EQ(o.code, Code::kOk) << o.message;
        got[r] = t.download().values();
      });
      const double ranks_sum = n * (n + 1) / 2.0;
      for (int r = 0; r < n; ++r)
        for (size_t j = 0; j < kLength; ++j) {
          const double unit = static_cast<double>(j % 5 + 1);
          const double want = op == ReduceOp::kSum   ? unit * ranks_sum
                              : op == ReduceOp::kAvg ? unit * ranks_sum / n
                              : op == ReduceOp::kMax ? unit * n
                                                     : unit;
          // avg rounds in 16-bit types (NCCL scales each input by 1/n before summing).
          const double tolerance = dtype == DType::kBF16  ? 0.02 * want
                                   : dtype == DType::kF16 ? 0.002 * want
                                                          : 1e-6 * want;
          ASSERT_NEAR(got[r][j], want, tolerance)
              << dtype_name(dtype) << " op " << static_cast<int>(op) << " rank " << r << " [" << j
              << "]";
        }
    }
  }
}

TEST_F(MultiGpu, ReduceScatterAllGatherBroadcast) {
  const int n = ranks();
  NcclGroup g = connect(n, "collectives", store_, true);
  ASSERT_FALSE(HasFailure());
  constexpr size_t kChunk = 7;
  on_gpus(n, [&](int r) {
    // reduce_scatter: rank r gets the sum over ranks of chunk r.
    HostTensor in(DType::kF32, n * kChunk);
    for (size_t j = 0; j < n * kChunk; ++j) in.set(j, value(r, j) + static_cast<double>(j));
    DeviceTensor din(DType::kF32, n * kChunk), dout(DType::kF32, kChunk);
    din.upload(in);
    TensorView iv = din.view(), ov = dout.view();
    EXPECT_EQ(outcome(g[r].reduce_scatter(&iv, &ov, ReduceOp::kSum, nullptr)).code, Code::kOk);
    std::vector<double> scattered = dout.download().values();
    for (size_t k = 0; k < kChunk; ++k) {
      const size_t j = r * kChunk + k;
      double want = 0;
      for (int q = 0; q < n; ++q) want += value(q, j) + static_cast<double>(j);
      EXPECT_EQ(scattered[k], want) << "rank " << r << " [" << k << "]";
    }
    // all_gather in place: chunk r of the output is this rank's input.
    DeviceTensor all(DType::kI32, n * kChunk);
    HostTensor mine(DType::kI32, n * kChunk);
    for (size_t k = 0; k < kChunk; ++k) mine.set(r * kChunk + k, 100 * r + k);
    all.upload(mine);
    TensorView chunk = all.view(r * kChunk, kChunk), av = all.view();
    EXPECT_EQ(outcome(g[r].all_gather(&chunk, &av, nullptr)).code, Code::kOk);
    std::vector<double> gathered = all.download().values();
    for (int q = 0; q < n; ++q)
      for (size_t k = 0; k < kChunk; ++k) EXPECT_EQ(gathered[q * kChunk + k], 100 * q + k);
    // broadcast from every root.
    for (int root = 0; root < n; ++root) {
      HostTensor b(DType::kU8, 5);
      for (size_t k = 0; k < 5; ++k) b.set(k, r == root ? 10 * root + k : 255);
      DeviceTensor db(DType::kU8, 5);
      db.upload(b);
      TensorView bv = db.view();
      EXPECT_EQ(outcome(g[r].broadcast(&bv, root, nullptr)).code, Code::kOk);
      std::vector<double> got = db.download().values();
      for (size_t k = 0; k < 5; ++k) EXPECT_EQ(got[k], 10 * root + k) << "root " << root;
    }
  });
}

// Rank s sends count(s, d) = (s + d) % 3 + 1 elements to rank d, packed in rank order; the
// receiver lays them out in reverse rank order. Element k of the message is 1000 s + 10 d + k.
TEST_F(MultiGpu, AllToAllUnequalCounts) {
  const int n = ranks();
  NcclGroup g = connect(n, "all_to_all", store_, false);
  ASSERT_FALSE(HasFailure());
  auto count = [](int s, int d) { return static_cast<int64_t>((s + d) % 3 + 1); };
  on_gpus(n, [&](int r) {
    std::vector<int64_t> sc(n), so(n), rc(n), ro(n);
    int64_t at = 0;
    for (int d = 0; d < n; ++d) {
      sc[d] = count(r, d);
      so[d] = at;
      at += sc[d];
    }
    const int64_t send_total = at;
    at = 0;
    for (int s = n - 1; s >= 0; --s) {
      rc[s] = count(s, r);
      ro[s] = at;
      at += rc[s];
    }
    const int64_t recv_total = at;
    HostTensor in(DType::kI64, send_total);
    for (int d = 0; d < n; ++d)
      for (int64_t k = 0; k < sc[d]; ++k) in.set(so[d] + k, 1000 * r + 10 * d + k);
    DeviceTensor din(DType::kI64, send_total), dout(DType::kI64, recv_total);
    din.upload(in);
    TensorView iv = din.view(), ov = dout.view();
    Outcome o =
        outcome(g[r].all_to_all(&iv, sc.data(), so.data(), &ov, rc.data(), ro.data(), nullptr));
    EXPECT_EQ(o.code, Code::kOk) << o.message;
    std::vector<double> got = dout.download().values();
    for (int s = 0; s < n; ++s)
      for (int64_t k = 0; k < rc[s]; ++k)
        EXPECT_EQ(got[ro[s] + k], 1000 * s + 10 * r + k) << "rank " << r << " from " << s;
  });
}

// Rank 0 sends to rank 1, which answers with twice the values: sync and async.
TEST_F(MultiGpu, SendRecvPingPong) {
  const int n = ranks();
  NcclGroup g = connect(n, "p2p", store_, false);
  ASSERT_FALSE(HasFailure());
  on_gpus(2, [&](int r) {
    DeviceTensor t(DType::kF32, 64);
    HostTensor h(DType::kF32, 64);
    for (size_t k = 0; k < 64; ++k) h.set(k, r == 0 ? k : -1);
    t.upload(h);
    TensorView v = t.view();
    if (r == 0) {
      EXPECT_EQ(outcome(g[0].send(&v, 1, 7, nullptr)).code, Code::kOk);
      ICommWork* raw = nullptr;
      EXPECT_EQ(outcome(g[0].recv_async(&v, 1, 8, nullptr, &raw)).code, Code::kOk);
      CommWorkPtr work(raw);
      EXPECT_EQ(outcome(work->wait()).code, Code::kOk);
      std::vector<double> got = t.download().values();
      for (size_t k = 0; k < 64; ++k) EXPECT_EQ(got[k], 2.0 * k);
    } else {
      EXPECT_EQ(outcome(g[1].recv(&v, 0, 7, nullptr)).code, Code::kOk);
      HostTensor doubled = t.download();
      for (size_t k = 0; k < 64; ++k) doubled.set(k, 2 * doubled.get(k));
      t.upload(doubled);
      ICommWork* raw = nullptr;
      EXPECT_EQ(outcome(g[1].send_async(&v, 0, 8, nullptr, &raw)).code, Code::kOk);
      CommWorkPtr work(raw);
      EXPECT_EQ(outcome(work->wait()).code, Code::kOk);
    }
  });
}

// The last rank never joins an all_reduce: the others' all_reduce times out, the watchdog
// aborts their communicators, and the failure names the operation and group. With
// blocking_wait it comes from the call itself; without, from the next call. Nothing hangs.
// A first all_reduce of every rank connects the ranks beforehand (NCCL connects on first
// use, inside the call: MissingRankOnFirstUse covers that).
class MissingRank : public MultiGpu, public ::testing::WithParamInterface<bool> {};

TEST_P(MissingRank, TimesOutAndAborts) {
  const int n = ranks();
  const bool blocking = GetParam();
  const std::string key = blocking ? "late/blocking" : "late/ordered";
  NcclGroup g = connect(n, key, store_, blocking);
  ASSERT_FALSE(HasFailure());
  constexpr size_t kLength = 1 << 16;
  on_gpus(n, [&](int r) {
    DeviceTensor t(DType::kF32, kLength);
    TensorView v = t.view();
    EXPECT_EQ(outcome(g[r].all_reduce(&v, ReduceOp::kSum, nullptr)).code, Code::kOk);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
  const auto start = Clock::now();
  std::vector<Outcome> first(n), next(n), after(n);
  on_gpus(n - 1, [&](int r) {
    g[r].set_timeout_ms(500);
    DeviceTensor t(DType::kF32, kLength);
    TensorView v = t.view();
    first[r] = outcome(g[r].all_reduce(&v, ReduceOp::kSum, nullptr));
    if (!blocking) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    next[r] = outcome(g[r].barrier());
    after[r] = outcome(g[r].barrier());
    (void)cudaDeviceSynchronize();  // the aborted kernels have returned
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(60));
  for (int r = 0; r < n - 1; ++r) {
    const Outcome& failed = blocking ? first[r] : next[r];
    EXPECT_EQ(failed.code, Code::kDeadlineExceeded) << failed.message;
    EXPECT_TRUE(has(failed.message, "all_reduce on group '" + key + "' (rank " + std::to_string(r) +
                                        " of " + std::to_string(n) + "): timed out after 500 ms"))
        << failed.message;
    if (!blocking) {
      EXPECT_EQ(first[r].code, Code::kOk) << first[r].message;  // it was only queued
    }
    const Outcome& later = blocking ? next[r] : after[r];
    EXPECT_EQ(later.code, Code::kFailedPrecondition) << later.message;
    EXPECT_TRUE(has(later.message, "unusable after an earlier failure")) << later.message;
  }
  g[n - 1].set_timeout_ms(5000);  // bounds its teardown, whatever its aborted peers left
  g.comms.clear();  // the absent rank's communicator included: destroying it does not hang
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(120));
}

// The same on a group's first operation: the failure may come while NCCL connects the ranks
// (queueing times out) or from the watchdog, from the call or the next one; either way it is
// kDeadlineExceeded naming the operation and group, within seconds.
TEST_F(MultiGpu, MissingRankOnFirstUse) {
  const int n = ranks();
  NcclGroup g = connect(n, "cold", store_, false);
  ASSERT_FALSE(HasFailure());
  const auto start = Clock::now();
  std::vector<Outcome> first(n), next(n);
  on_gpus(n - 1, [&](int r) {
    g[r].set_timeout_ms(500);
    DeviceTensor t(DType::kF32, 1024);
    TensorView v = t.view();
    first[r] = outcome(g[r].all_reduce(&v, ReduceOp::kSum, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    next[r] = outcome(g[r].barrier());
    (void)cudaDeviceSynchronize();
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(60));
  for (int r = 0; r < n - 1; ++r) {
    const Outcome& failed = first[r].code != Code::kOk ? first[r] : next[r];
    EXPECT_EQ(failed.code, Code::kDeadlineExceeded) << failed.message;
    EXPECT_TRUE(has(failed.message, "all_reduce on group 'cold' (rank " + std::to_string(r) +
                                        " of " + std::to_string(n) + ")"))
        << failed.message;
    EXPECT_TRUE(has(failed.message, "500 ms")) << failed.message;
  }
  g[n - 1].set_timeout_ms(5000);
  g.comms.clear();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(120));
}

INSTANTIATE_TEST_SUITE_P(Waits, MissingRank, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "BlockingWait" : "StreamOrdered";
                         });

// Two groups over the same ranks and backends, used alternately; the first group is then
// made again under the same key (a fresh unique id, not the stale one in the store).
TEST_F(MultiGpu, GroupsShareABackendAndKeysCanBeReused) {
  const int n = ranks();
  NcclGroup a = connect(n, "a", store_, false);
  ASSERT_FALSE(HasFailure());
  NcclGroup b;
  b.comms.resize(n);
  std::vector<Outcome> made(n);
  auto remake = [&](const std::string& key, NcclGroup& into) {
    on_gpus(n, [&](int r) {
      ICommunicator* raw = nullptr;
      made[r] = outcome(interface_cast<ICommBackend>(a.backends[r].get())
                            ->create_communicator(&store_, {key.data(), key.size()}, r, n,
                                                  DeviceType::kCuda, &raw));
      into.comms[r].reset(raw);
    });
    for (int r = 0; r < n; ++r) ASSERT_EQ(made[r].code, Code::kOk) << made[r].message;
  };
  remake("b", b);
  on_gpus(n, [&](int r) {
    DeviceTensor t(DType::kI32, 3);
    HostTensor h(DType::kI32, 3);
    for (size_t k = 0; k < 3; ++k) h.set(k, r + 1);
    t.upload(h);
    TensorView v = t.view();
    EXPECT_EQ(outcome(a[r].all_reduce(&v, ReduceOp::kSum, nullptr)).code, Code::kOk);
    EXPECT_EQ(outcome(b[r].all_reduce(&v, ReduceOp::kMax, nullptr)).code, Code::kOk);
    EXPECT_EQ(t.download().values(), std::vector<double>(3, n * (n + 1) / 2));
  });
  on_gpus(n, [&](int r) { a.comms[r].reset(); });
  NcclGroup again;
  again.comms.resize(n);
  remake("a", again);
  on_gpus(n, [&](int r) { EXPECT_EQ(outcome(again[r].barrier()).code, Code::kOk); });
  on_gpus(n, [&](int r) {
    again.comms[r].reset();
    b.comms[r].reset();
  });
}

}  // namespace
}  // namespace loom::testing
