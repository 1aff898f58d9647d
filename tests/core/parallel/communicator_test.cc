// The asynchronous path (communicator 1.1) of the core's communicators: LocalCommunicator
// does the work at once and returns a finished handle; TimedCommunicator passes calls to
// a 1.1 backend and counts the time spent in wait() as blocked, and falls back to the
// synchronous call for a 1.0 backend.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "core/parallel/comm_stats.h"
#include "core/parallel/local_communicator.h"
#include "core/parallel/timed_communicator.h"
#include "loom/cpp/comm_work.h"
#include "loom/cpp/error.h"

namespace loom::core {
namespace {

struct Outcome {
  Code code;
  std::string message;
};
Outcome outcome(Status status) {
  Code code = status.code;
  return {code, code == Code::kOk ? std::string() : take_message(&status)};
}

TensorView view_of(std::vector<float>& v) {
  TensorView t{};
  t.data = v.data();
  t.dtype = DType::kF32;
  t.device = Device{DeviceType::kCpu, 0};
  t.ndim = 1;
  t.shape[0] = static_cast<int64_t>(v.size());
  t.strides[0] = 1;
  return t;
}

CommWorkPtr issue(const std::function<Status(ICommWork**)>& call) {
  ICommWork* raw = nullptr;
  Outcome o = outcome(call(&raw));
  EXPECT_EQ(o.code, Code::kOk) << o.message;
  return CommWorkPtr(raw);
}

TEST(LocalCommunicatorAsync, DoesTheWorkAtOnce) {
  LocalCommunicator comm("solo");
  EXPECT_TRUE(has_async(comm));
  std::vector<float> in{1, 2, 3}, out(3), gathered(3);
  TensorView vi = view_of(in), vo = view_of(out), vg = view_of(gathered);
  CommWorkPtr w = issue([&](ICommWork** o) {
    return comm.reduce_scatter_async(&vi, &vo, ReduceOp::kSum, nullptr, o);
  });
  EXPECT_TRUE(w->done());  // finished before the call returned
  EXPECT_EQ(out, in);
  EXPECT_EQ(outcome(w->wait()).code, Code::kOk);
  EXPECT_EQ(outcome(w->wait()).code, Code::kOk);
  CommWorkPtr g = issue([&](ICommWork** o) { return comm.all_gather_async(&vi, &vg, nullptr, o); });
  EXPECT_EQ(gathered, in);
  CommWorkPtr r =
      issue([&](ICommWork** o) { return comm.all_reduce_async(&vi, ReduceOp::kAvg, nullptr, o); });
  EXPECT_EQ(outcome(r->wait()).code, Code::kOk);
  EXPECT_EQ(in, (std::vector<float>{1, 2, 3}));
}

TEST(LocalCommunicatorAsync, ErrorsComeFromWaitEveryTime) {
  LocalCommunicator comm("solo");
  std::vector<float> data{1};
  TensorView v = view_of(data);
  CommWorkPtr b = issue([&](ICommWork** o) { return comm.broadcast_async(&v, 1, nullptr, o); });
  Outcome first = outcome(b->wait()), second = outcome(b->wait());
  EXPECT_EQ(first.code, Code::kInvalidArgument);
  EXPECT_NE(first.message.find("root 1"), std::string::npos) << first.message;
  EXPECT_EQ(second.code, first.code);
  EXPECT_EQ(second.message, first.message);
  CommWorkPtr s = issue([&](ICommWork** o) { return comm.send_async(&v, 1, 0, nullptr, o); });
  EXPECT_EQ(outcome(s->wait()).code, Code::kInvalidArgument);
  CommWorkPtr r = issue([&](ICommWork** o) { return comm.recv_async(&v, 1, 0, nullptr, o); });
  EXPECT_EQ(outcome(r->wait()).code, Code::kInvalidArgument);
  EXPECT_EQ(outcome(comm.all_reduce_async(&v, ReduceOp::kSum, nullptr, nullptr)).code,
            Code::kInvalidArgument);
}

// A handle whose operation finishes `delay` after it is issued.
class SlowWork final : public Object<ICommWork> {
 public:
  explicit SlowWork(std::chrono::milliseconds delay)
      : until_(std::chrono::steady_clock::now() + delay) {}
  Status wait() noexcept override {
    std::this_thread::sleep_until(until_);
    return ok_status();
  }
  bool done() noexcept override { return std::chrono::steady_clock::now() >= until_; }

 private:
  std::chrono::steady_clock::time_point until_;
};

// A backend's communicator of interface 1.`minor`: synchronous calls succeed at once;
// asynchronous ones (which a 1.0 caller must never make) return SlowWork.
class FakeCommunicator final : public Object<ICommunicator> {
 public:
  explicit FakeCommunicator(int32_t minor) : minor_(minor) {}
  InterfaceInfo interface_info() const noexcept override {
    return {kinds::kCommunicator.kind, 1, minor_};
  }
  int32_t rank() const noexcept override { return 0; }
  int32_t size() const noexcept override { return 2; }
  Status all_reduce(TensorView*, ReduceOp, void*) noexcept override { return sync(); }
  Status reduce_scatter(const TensorView*, TensorView*, ReduceOp, void*) noexcept override {
    return sync();
  }
  Status all_gather(const TensorView*, TensorView*, void*) noexcept override { return sync(); }
  Status broadcast(TensorView*, int32_t, void*) noexcept override { return sync(); }
  Status all_to_all(const TensorView*, const int64_t*, const int64_t*, TensorView*, const int64_t*,
                    const int64_t*, void*) noexcept override {
    return sync();
  }
  Status send(const TensorView*, int32_t, int32_t, void*) noexcept override { return sync(); }
  Status recv(TensorView*, int32_t, int32_t, void*) noexcept override { return sync(); }
  Status barrier() noexcept override { return sync(); }
  void set_timeout_ms(int64_t) noexcept override {}
  Status all_reduce_async(TensorView*, ReduceOp, void*, ICommWork** out) noexcept override {
    return async(out);
  }
  Status reduce_scatter_async(const TensorView*, TensorView*, ReduceOp, void*,
                              ICommWork** out) noexcept override {
    return async(out);
  }
  Status all_gather_async(const TensorView*, TensorView*, void*,
                          ICommWork** out) noexcept override {
    return async(out);
  }
  Status broadcast_async(TensorView*, int32_t, void*, ICommWork** out) noexcept override {
    return async(out);
  }
  Status send_async(const TensorView*, int32_t, int32_t, void*, ICommWork** out) noexcept override {
    return async(out);
  }
  Status recv_async(TensorView*, int32_t, int32_t, void*, ICommWork** out) noexcept override {
    return async(out);
  }

  int sync_calls = 0;
  int async_calls = 0;

 private:
  Status sync() {
    ++sync_calls;
    return ok_status();
  }
  Status async(ICommWork** out) {
    ++async_calls;
    *out = new SlowWork(std::chrono::milliseconds(100));
    return ok_status();
  }
  int32_t minor_;
};

TEST(TimedCommunicatorAsync, CountsTheWaitAsBlocked) {
  CommStats stats;
  auto* inner = new FakeCommunicator(1);
  TimedCommunicator comm(inner, "dp/0", stats);
  std::vector<float> data(8);
  TensorView v = view_of(data);
  CommWorkPtr w =
      issue([&](ICommWork** o) { return comm.all_reduce_async(&v, ReduceOp::kSum, nullptr, o); });
  EXPECT_EQ(inner->async_calls, 1);
  EXPECT_LT(stats.blocked_seconds(), 0.05);  // issuing does not block
  EXPECT_FALSE(w->done());
  EXPECT_EQ(outcome(w->wait()).code, Code::kOk);
  EXPECT_TRUE(w->done());
  EXPECT_GE(stats.blocked_seconds(), 0.05);
  auto entries = stats.entries();
  ASSERT_EQ(entries.count("dp/0 all_reduce"), 1u);
  EXPECT_EQ(entries["dp/0 all_reduce"].calls, 1);
  EXPECT_EQ(entries["dp/0 all_reduce"].bytes, 32);
  // A second wait adds no second call.
  EXPECT_EQ(outcome(w->wait()).code, Code::kOk);
  EXPECT_EQ(stats.entries()["dp/0 all_reduce"].calls, 1);
}

TEST(TimedCommunicatorAsync, UnwaitedHandleIsCountedWhenDestroyed) {
  CommStats stats;
  TimedCommunicator comm(new FakeCommunicator(1), "tp/0", stats);
  std::vector<float> a(4), b(8);
  TensorView va = view_of(a), vb = view_of(b);
  issue([&](ICommWork** o) { return comm.all_gather_async(&va, &vb, nullptr, o); }).reset();
  EXPECT_GE(stats.blocked_seconds(), 0.05);
  EXPECT_EQ(stats.entries()["tp/0 all_gather"].calls, 1);
}

TEST(TimedCommunicatorAsync, WaitOnAWorkerThreadIsNotBlocked) {
  CommStats stats;
  TimedCommunicator comm(new FakeCommunicator(1), "dp/0", stats);
  std::vector<float> a(4);
  TensorView va = view_of(a);
  CommWorkPtr w = issue([&](ICommWork** o) { return comm.broadcast_async(&va, 0, nullptr, o); });
  std::thread worker([&] {
    TimedCommunicator::mark_worker_thread();
    EXPECT_EQ(outcome(w->wait()).code, Code::kOk);
  });
  worker.join();
  EXPECT_EQ(stats.blocked_seconds(), 0.0);
  EXPECT_EQ(stats.entries()["dp/0 broadcast"].calls, 1);
}

TEST(TimedCommunicatorAsync, OlderBackendFallsBackToTheSynchronousCall) {
  CommStats stats;
  auto* inner = new FakeCommunicator(0);
  TimedCommunicator comm(inner, "pp/0", stats);
  EXPECT_TRUE(has_async(comm));  // the wrapper itself is 1.1
  std::vector<float> a(4), b(8);
  TensorView va = view_of(a), vb = view_of(b);
  std::vector<CommWorkPtr> works;
  works.push_back(
      issue([&](ICommWork** o) { return comm.all_reduce_async(&va, ReduceOp::kSum, nullptr, o); }));
  works.push_back(issue([&](ICommWork** o) {
    return comm.reduce_scatter_async(&vb, &va, ReduceOp::kSum, nullptr, o);
  }));
  works.push_back(
      issue([&](ICommWork** o) { return comm.all_gather_async(&va, &vb, nullptr, o); }));
  works.push_back(issue([&](ICommWork** o) { return comm.broadcast_async(&va, 1, nullptr, o); }));
  works.push_back(issue([&](ICommWork** o) { return comm.send_async(&va, 1, 0, nullptr, o); }));
  works.push_back(issue([&](ICommWork** o) { return comm.recv_async(&va, 1, 0, nullptr, o); }));
  EXPECT_EQ(inner->async_calls, 0);
  EXPECT_EQ(inner->sync_calls, 6);
  for (auto& w : works) {
    EXPECT_TRUE(w->done());
    EXPECT_EQ(outcome(w->wait()).code, Code::kOk);
  }
  EXPECT_EQ(stats.entries()["pp/0 send"].calls, 1);
  EXPECT_EQ(outcome(comm.send_async(&va, 1, 0, nullptr, nullptr)).code, Code::kInvalidArgument);
}

TEST(TimedCommunicatorAsync, OverLocalCommunicator) {
  CommStats stats;
  TimedCommunicator comm(new LocalCommunicator("solo"), "solo", stats);
  std::vector<float> in{4, 5}, out(2);
  TensorView vi = view_of(in), vo = view_of(out);
  CommWorkPtr w = issue([&](ICommWork** o) { return comm.all_gather_async(&vi, &vo, nullptr, o); });
  EXPECT_EQ(outcome(w->wait()).code, Code::kOk);
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace loom::core
