// The asynchronous operations of comm_backend "gloo" (communicator 1.1): the same results
// as the synchronous calls, several in flight at once waited in any order, done(), the
// failures of the synchronous calls surfacing from wait(), and handles destroyed unwaited
// or after their communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "loom/cpp/comm_work.h"
#include "tests/plugins/comm_gloo/comm_env.h"

namespace loom::testing {
namespace {

using Clock = std::chrono::steady_clock;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Issues through `issue(ICommWork**)` and returns the handle; fails the test when the
// call itself fails.
template <class Issue>
CommWorkPtr start(Issue&& issue) {
  ICommWork* raw = nullptr;
  Outcome o = outcome(issue(&raw));
  EXPECT_EQ(o.code, Code::kOk) << o.message;
  EXPECT_EQ(o.code == Code::kOk, raw != nullptr);
  return CommWorkPtr(raw);
}

// Elements of operation k's output in ManyInFlightWaitedInAnyOrder.
size_t kind_out_size(int k, int n, size_t chunk) {
  return k % 4 == 2 ? n * chunk : k % 4 == 3 ? chunk : 1;
}

TEST(Async, TheCommunicatorIsVersion1Point1) {
  InMemoryStore store;
  Group group = connect_group(2, "version", store);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(has_async(group[0]));
  EXPECT_EQ(group[0].interface_info().minor, 1);
}

class AsyncSizes : public ::testing::TestWithParam<int> {
 protected:
  int size() const { return GetParam(); }
  InMemoryStore store_;
};

// all_reduce, reduce_scatter and all_gather, each issued async and sync on the same
// inputs: the outputs agree exactly.
TEST_P(AsyncSizes, SameResultsAsSync) {
  Group group = connect_group(size(), "same/" + std::to_string(size()), store_);
  ASSERT_FALSE(HasFailure());
  constexpr size_t kChunk = 5;
  const int n = size();
  auto value = [](int r, size_t j) { return (j % 2 ? -1.0 : 1.0) * (r * 16.0 + j) + 0.5; };
  struct Tensors {
    HostTensor reduce_a, reduce_b, scatter_in, scatter_a, scatter_b, gather_in, gather_a, gather_b;
  };
  std::vector<Tensors> t;
  for (int r = 0; r < n; ++r)
    t.push_back({HostTensor(DType::kF32, n * kChunk), HostTensor(DType::kF32, n * kChunk),
                 HostTensor(DType::kF32, n * kChunk), HostTensor(DType::kF32, kChunk),
                 HostTensor(DType::kF32, kChunk), HostTensor(DType::kF32, kChunk),
                 HostTensor(DType::kF32, n * kChunk), HostTensor(DType::kF32, n * kChunk)});
  std::vector<std::vector<Outcome>> outcomes(n);
  run_ranks(n, [&](int r) {
    Tensors& m = t[r];
    for (size_t j = 0; j < n * kChunk; ++j) {
      m.reduce_a.set(j, value(r, j));
      m.reduce_b.set(j, value(r, j));
      m.scatter_in.set(j, value(r, j));
    }
    for (size_t j = 0; j < kChunk; ++j) m.gather_in.set(j, value(r, j));
    ICommunicator& c = group[r];
    TensorView ra = m.reduce_a.view(), rb = m.reduce_b.view(), si = m.scatter_in.view(),
               sa = m.scatter_a.view(), sb = m.scatter_b.view(), gi = m.gather_in.view(),
               ga = m.gather_a.view(), gb = m.gather_b.view();
    CommWorkPtr w1 =
        start([&](ICommWork** w) { return c.all_reduce_async(&ra, ReduceOp::kSum, nullptr, w); });
    CommWorkPtr w2 = start([&](ICommWork** w) {
      return c.reduce_scatter_async(&si, &sa, ReduceOp::kAvg, nullptr, w);
    });
    CommWorkPtr w3 = start([&](ICommWork** w) { return c.all_gather_async(&gi, &ga, nullptr, w); });
    auto& o = outcomes[r];
    o.push_back(outcome(w1->wait()));
    o.push_back(outcome(w2->wait()));
    o.push_back(outcome(w3->wait()));
    o.push_back(outcome(c.all_reduce(&rb, ReduceOp::kSum, nullptr)));
    o.push_back(outcome(c.reduce_scatter(&si, &sb, ReduceOp::kAvg, nullptr)));
    o.push_back(outcome(c.all_gather(&gi, &gb, nullptr)));
  });
  for (int r = 0; r < n; ++r) {
    for (const Outcome& o : outcomes[r]) ASSERT_EQ(o.code, Code::kOk) << o.message;
    EXPECT_EQ(t[r].reduce_a.values(), t[r].reduce_b.values());
    EXPECT_EQ(t[r].scatter_a.values(), t[r].scatter_b.values());
    EXPECT_EQ(t[r].gather_a.values(), t[r].gather_b.values());
    // And they are right: element j of the all_reduce is the sum over ranks.
    for (size_t j = 0; j < n * kChunk; ++j) {
      double sum = 0;
      for (int q = 0; q < n; ++q) sum += value(q, j);
      EXPECT_EQ(t[r].reduce_a.get(j), sum) << "rank " << r << " element " << j;
    }
    for (int q = 0; q < n; ++q)
      for (size_t j = 0; j < kChunk; ++j) EXPECT_EQ(t[r].gather_a.get(q * kChunk + j), value(q, j));
  }
}

// Eight operations in flight per rank (all_reduce, broadcast, all_gather,
// reduce_scatter), waited in an order that differs per rank; then a synchronous call,
// which runs after all of them.
TEST_P(AsyncSizes, ManyInFlightWaitedInAnyOrder) {
  Group group = connect_group(size(), "many/" + std::to_string(size()), store_);
  ASSERT_FALSE(HasFailure());
  const int n = size();
  constexpr int kOps = 8;
  constexpr size_t kN = 1000;
  std::vector<std::vector<HostTensor>> ins(n), outs(n);
  std::vector<std::vector<Outcome>> outcomes(n);
  std::vector<std::vector<bool>> done_after_sync(n);
  run_ranks(n, [&](int r) {
    ICommunicator& c = group[r];
    for (int k = 0; k < kOps; ++k) {
      ins[r].emplace_back(DType::kF64, n * kN);
      outs[r].emplace_back(DType::kF64, kind_out_size(k, n, kN));
    }
    std::vector<CommWorkPtr> works;
    for (int k = 0; k < kOps; ++k) {
      HostTensor& in = ins[r][k];
      for (size_t j = 0; j < in.n; ++j) in.set(j, 1000.0 * k + 10.0 * r + j % 7);
      TensorView vi = in.view(), vo = outs[r][k].view();  // copied by the call
      switch (k % 4) {
        case 0:
          works.push_back(start(
              [&](ICommWork** w) { return c.all_reduce_async(&vi, ReduceOp::kMax, nullptr, w); }));
          break;
        case 1:
          works.push_back(
              start([&](ICommWork** w) { return c.broadcast_async(&vi, k % n, nullptr, w); }));
          break;
        case 2:
          vi.shape[0] = kN;  // all_gather sends the first kN elements
          works.push_back(
              start([&](ICommWork** w) { return c.all_gather_async(&vi, &vo, nullptr, w); }));
          break;
        case 3:
          works.push_back(start([&](ICommWork** w) {
            return c.reduce_scatter_async(&vi, &vo, ReduceOp::kSum, nullptr, w);
          }));
          break;
      }
    }
    // Rank r waits from operation r onwards, wrapping around; odd ranks backwards.
    outcomes[r].resize(kOps);
    for (int i = 0; i < kOps; ++i) {
      int k = (r % 2 ? kOps - 1 - i + r : i + r) % kOps;
      outcomes[r][k] = outcome(works[k]->wait());
      EXPECT_TRUE(works[k]->done());
    }
    // A second wait returns the same status.
    EXPECT_EQ(outcome(works[0]->wait()).code, Code::kOk);
    HostTensor last(DType::kF32, 3);
    TensorView vl = last.view();
    EXPECT_EQ(outcome(c.all_reduce(&vl, ReduceOp::kSum, nullptr)).code, Code::kOk);
  });
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < kOps; ++k) {
      ASSERT_EQ(outcomes[r][k].code, Code::kOk) << outcomes[r][k].message;
      const HostTensor& in = ins[r][k];
      const HostTensor& out = outs[r][k];
      for (size_t j = 0; j < kN; j += 97) {
        const double base = 1000.0 * k + j % 7;
        switch (k % 4) {
          case 0:  // max over ranks
            EXPECT_EQ(in.get(j), base + 10.0 * (n - 1)) << r << " " << k << " " << j;
            break;
          case 1:  // the root's
            EXPECT_EQ(in.get(j), base + 10.0 * (k % n)) << r << " " << k << " " << j;
            break;
          case 2:  // chunk q from rank q
            for (int q = 0; q < n; ++q)
              EXPECT_EQ(out.get(q * kN + j), base + 10.0 * q) << r << " " << k << " " << j;
            break;
          case 3: {  // chunk r of the sum
            const size_t at = r * kN + j;
            double sum = 0;
            for (int q = 0; q < n; ++q) sum += 1000.0 * k + 10.0 * q + at % 7;
            EXPECT_EQ(out.get(j), sum) << r << " " << k << " " << j;
            break;
          }
        }
      }
    }
  }
}

// done() turns true without anyone calling wait().
TEST(Async, DoneBecomesTrue) {
  InMemoryStore store;
  Group group = connect_group(2, "done", store);
  ASSERT_FALSE(HasFailure());
  std::vector<HostTensor> t(2, HostTensor(DType::kF32, 4));
  std::vector<bool> finished(2);
  run_ranks(2, [&](int r) {
    for (size_t i = 0; i < 4; ++i) t[r].set(i, r + 1.0);
    TensorView v = t[r].view();
    CommWorkPtr w = start([&](ICommWork** out) {
      return group[r].all_reduce_async(&v, ReduceOp::kSum, nullptr, out);
    });
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!w->done() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    finished[r] = w->done();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(finished[r]);
    EXPECT_EQ(t[r].values(), (std::vector<double>{3, 3, 3, 3}));
  }
}

// Point-to-point in issue order with the collectives: a send completes when its recv is
// posted, so (as with the synchronous calls) one side sends first.
TEST(Async, SendRecv) {
  InMemoryStore store;
  Group group = connect_group(2, "p2p_async", store);
  ASSERT_FALSE(HasFailure());
  HostTensor got(DType::kI32, 3), back(DType::kI32, 3);
  std::vector<Outcome> outcomes(4);
  run_ranks(2, [&](int r) {
    HostTensor mine(DType::kI32, 3);
    for (size_t i = 0; i < 3; ++i) mine.set(i, 10.0 * (r + 1) + i);
    TensorView vm = mine.view();
    if (r == 0) {
      TensorView vb = back.view();
      CommWorkPtr s =
          start([&](ICommWork** w) { return group[0].send_async(&vm, 1, 7, nullptr, w); });
      CommWorkPtr g =
          start([&](ICommWork** w) { return group[0].recv_async(&vb, 1, 8, nullptr, w); });
      outcomes[1] = outcome(g->wait());
      outcomes[0] = outcome(s->wait());
    } else {
      TensorView vg = got.view();
      CommWorkPtr g =
          start([&](ICommWork** w) { return group[1].recv_async(&vg, 0, 7, nullptr, w); });
      CommWorkPtr s =
          start([&](ICommWork** w) { return group[1].send_async(&vm, 0, 8, nullptr, w); });
      outcomes[3] = outcome(s->wait());
      outcomes[2] = outcome(g->wait());
    }
  });
  for (const Outcome& o : outcomes) EXPECT_EQ(o.code, Code::kOk) << o.message;
  EXPECT_EQ(got.values(), (std::vector<double>{10, 11, 12}));
  EXPECT_EQ(back.values(), (std::vector<double>{20, 21, 22}));
}

// Bad arguments come from wait() as kInvalidArgument and leave the communicator usable; a
// null handle pointer is refused by the call itself.
TEST(Async, BadArgumentsComeFromWait) {
  InMemoryStore store;
  Group group = connect_group(2, "bad_async", store);
  ASSERT_FALSE(HasFailure());
  std::vector<Outcome> bad(2), null_out(2), after(2);
  std::vector<HostTensor> t(2, HostTensor(DType::kF32, 2));
  run_ranks(2, [&](int r) {
    ICommunicator& c = group[r];
    HostTensor seven(DType::kF32, 7), three(DType::kF32, 3);
    TensorView v7 = seven.view(), v3 = three.view();
    CommWorkPtr w =
        start([&](ICommWork** out) { return c.all_gather_async(&v3, &v7, nullptr, out); });
    bad[r] = outcome(w->wait());
    null_out[r] = outcome(c.all_reduce_async(&v3, ReduceOp::kSum, nullptr, nullptr));
    for (size_t i = 0; i < 2; ++i) t[r].set(i, r + 1.0);
    TensorView v = t[r].view();
    CommWorkPtr ok = start(
        [&](ICommWork** out) { return c.all_reduce_async(&v, ReduceOp::kSum, nullptr, out); });
    after[r] = outcome(ok->wait());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(bad[r].code, Code::kInvalidArgument);
    EXPECT_TRUE(has(bad[r].message,
                    "all_gather on group 'bad_async' (rank " + std::to_string(r) + " of 2)"))
        << bad[r].message;
    EXPECT_EQ(null_out[r].code, Code::kInvalidArgument) << null_out[r].message;
    EXPECT_EQ(after[r].code, Code::kOk) << after[r].message;
    EXPECT_EQ(t[r].values(), (std::vector<double>{3, 3}));
  }
}

// Rank 0 never joins: wait() gives the synchronous call's kDeadlineExceeded and message,
// twice; operations issued after it (async or not) get kFailedPrecondition.
TEST(Async, TimeoutSurfacesFromWait) {
  InMemoryStore store;
  Group group = connect_group(3, "tmo_async", store);
  ASSERT_FALSE(HasFailure());
  constexpr int64_t kTimeoutMs = 1500;
  std::vector<Outcome> first(3), again(3), queued(3), later(3);
  std::vector<double> seconds(3);
  run_ranks(3, [&](int r) {
    if (r == 0) return;
    ICommunicator& c = group[r];
    c.set_timeout_ms(kTimeoutMs);
    HostTensor a(DType::kF32, 1000), b(DType::kF32, 1000);
    TensorView va = a.view(), vb = b.view();
    auto t0 = Clock::now();
    CommWorkPtr w1 =
        start([&](ICommWork** w) { return c.all_reduce_async(&va, ReduceOp::kSum, nullptr, w); });
    CommWorkPtr w2 = start([&](ICommWork** w) { return c.all_gather_async(&va, &vb, nullptr, w); });
    first[r] = outcome(w1->wait());
    seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
    again[r] = outcome(w1->wait());
    queued[r] = outcome(w2->wait());
    later[r] = outcome(c.barrier());
  });
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(first[r].code, Code::kDeadlineExceeded) << first[r].message;
    EXPECT_TRUE(has(first[r].message, "all_reduce on group 'tmo_async' (rank " + std::to_string(r) +
                                          " of 3): timed out after 1.5 s"))
        << first[r].message;
    EXPECT_EQ(again[r].code, first[r].code);
    EXPECT_EQ(again[r].message, first[r].message);
    EXPECT_LT(seconds[r], kTimeoutMs / 1000.0 + 2.0);
    // all_gather's vb is (1000), not 3 x 1000, but the communicator failing first wins.
    EXPECT_EQ(queued[r].code, Code::kFailedPrecondition) << queued[r].message;
    EXPECT_TRUE(has(queued[r].message, "earlier failure")) << queued[r].message;
    EXPECT_EQ(later[r].code, Code::kFailedPrecondition) << later[r].message;
  }
}

// Rank 0's communicator is destroyed while the others wait on an async all_reduce.
TEST(Async, DeadPeerSurfacesFromWait) {
  InMemoryStore store;
  Group group = connect_group(3, "dead_async", store);
  ASSERT_FALSE(HasFailure());
  constexpr int64_t kTimeoutMs = 8000;
  std::vector<Outcome> outcomes(3);
  std::vector<double> seconds(3);
  run_ranks(3, [&](int r) {
    group[r].set_timeout_ms(kTimeoutMs);
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      group.comms[0].reset();
      return;
    }
    HostTensor t(DType::kF32, 1000);
    TensorView v = t.view();
    auto t0 = Clock::now();
    CommWorkPtr w = start([&](ICommWork** out) {
      return group[r].all_reduce_async(&v, ReduceOp::kSum, nullptr, out);
    });
    outcomes[r] = outcome(w->wait());
    seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  for (int r = 1; r < 3; ++r) {
    EXPECT_TRUE(outcomes[r].code == Code::kAborted || outcomes[r].code == Code::kDeadlineExceeded)
        << code_name(outcomes[r].code) << ": " << outcomes[r].message;
    EXPECT_TRUE(has(outcomes[r].message, "all_reduce on group 'dead_async'"))
        << outcomes[r].message;
    EXPECT_LT(seconds[r], kTimeoutMs / 1000.0 + 2.0);
  }
}

// Destroying a handle unwaited waits for its operation (the data is reduced afterwards).
TEST(Async, DestroyingAnUnwaitedHandleWaits) {
  InMemoryStore store;
  Group group = connect_group(2, "unwaited", store);
  ASSERT_FALSE(HasFailure());
  std::vector<HostTensor> t(2, HostTensor(DType::kF32, 100000));
  run_ranks(2, [&](int r) {
    for (size_t i = 0; i < t[r].n; ++i) t[r].set(i, r + 1.0);
    TensorView v = t[r].view();
    for (int k = 0; k < 3; ++k) {
      ICommWork* w = nullptr;
      ASSERT_EQ(outcome(group[r].all_reduce_async(&v, ReduceOp::kSum, nullptr, &w)).code,
                Code::kOk);
      w->destroy();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(t[r].get(0), 12.0);  // 3 -> 6 -> 12
    EXPECT_EQ(t[r].get(t[r].n - 1), 12.0);
  }
}

// A handle may outlive its communicator: operations queued when it is destroyed report
// kAborted (or kFailedPrecondition if the running one failed first); nothing hangs.
TEST(Async, HandlesOutliveTheCommunicator) {
  InMemoryStore store;
  Group group = connect_group(2, "outlive", store);
  ASSERT_FALSE(HasFailure());
  // Rank 1 never takes part: rank 0's first operation times out, the rest wait behind it.
  group[0].set_timeout_ms(1000);
  HostTensor a(DType::kF32, 10);
  std::vector<TensorView> views(4, a.view());
  std::vector<CommWorkPtr> works;
  for (int k = 0; k < 4; ++k)
    works.push_back(start([&](ICommWork** w) {
      return group[0].all_reduce_async(&views[k], ReduceOp::kSum, nullptr, w);
    }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  group.comms[0].reset();  // waits for the running operation (its timeout), aborts the rest
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(works[k]->done()) << k;
    Outcome o = outcome(works[k]->wait());
    if (k == 0) {
      EXPECT_EQ(o.code, Code::kDeadlineExceeded) << o.message;
    } else {
      EXPECT_TRUE(o.code == Code::kAborted || o.code == Code::kFailedPrecondition)
          << code_name(o.code) << ": " << o.message;
      EXPECT_TRUE(has(o.message, "all_reduce on group 'outlive' (rank 0 of 2)")) << o.message;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AsyncSizes, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "size" + std::to_string(info.param); });

}  // namespace
}  // namespace loom::testing
