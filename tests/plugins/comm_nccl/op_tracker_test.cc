// The timeout and failure bookkeeping of comm_backend "nccl" (plugins/comm_nccl/op_tracker.h,
// nccl_work.h) on the CPU, with a fake in place of the CUDA events: what the watchdog and
// the handles do when an operation finishes, hangs, or the device or a peer fails.
#include "plugins/comm_nccl/op_tracker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "plugins/comm_nccl/nccl_work.h"

namespace loom::comm_nccl {
namespace {

using std::chrono::milliseconds;
using Phase = OpProgress::Phase;

// An operation's device state, set by the test.
class FakeProgress final : public OpProgress {
 public:
  struct State {
    std::atomic<Phase> phase{Phase::kQueued};
    std::atomic<int> ordered{0};  // order_caller calls
    std::atomic<bool> refuse_order{false};
  };
  explicit FakeProgress(std::shared_ptr<State> state) : state_(std::move(state)) {}
  Phase phase(std::string* error) noexcept override {
    const Phase p = state_->phase.load();
    if (p == Phase::kError) *error = "cudaErrorIllegalAddress: an illegal memory access";
    return p;
  }
  bool order_caller(std::string* error) noexcept override {
    ++state_->ordered;
    if (!state_->refuse_order) return true;
    *error = "cudaStreamWaitEvent: cudaErrorLaunchFailure: unspecified launch failure";
    return false;
  }

 private:
  std::shared_ptr<State> state_;
};

struct Op {
  std::shared_ptr<FakeProgress::State> state = std::make_shared<FakeProgress::State>();
  std::shared_ptr<OpRecord> record;
};

Op make_op(const std::string& what, int64_t timeout_ms) {
  Op op;
  op.record =
      std::make_shared<OpRecord>(what, timeout_ms, std::make_unique<FakeProgress>(op.state));
  return op;
}

struct Result {
  bool finished = false;
  std::optional<Failure> failure;
};
Result result_of(const OpRecord& record) {
  Result r;
  r.finished = record.result(&r.failure);
  return r;
}

struct Outcome {
  Code code;
  std::string message;
};
Outcome outcome(Status status) {
  Outcome o{status.code, status.message != nullptr ? status.message : ""};
  status_release(&status);
  return o;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const Clock::time_point kT0 = Clock::now();

TEST(OpTracker, RetiresFinishedOperationsInIssueOrder) {
  OpTracker tracker;
  Op a = make_op("a", 1000), b = make_op("b", 1000);
  tracker.add(a.record);
  tracker.add(b.record);
  b.state->phase = Phase::kDone;  // finished, but behind `a` on the stream: not retired yet
  EXPECT_FALSE(tracker.poll(kT0));
  EXPECT_EQ(tracker.pending(), 2u);
  EXPECT_FALSE(result_of(*b.record).finished);
  EXPECT_EQ(tracker.front_what(), "a");
  a.state->phase = Phase::kDone;
  EXPECT_FALSE(tracker.poll(kT0));
  EXPECT_EQ(tracker.pending(), 0u);
  Result ra = result_of(*a.record), rb = result_of(*b.record);
  EXPECT_TRUE(ra.finished && !ra.failure);
  EXPECT_TRUE(rb.finished && !rb.failure);
  EXPECT_EQ(tracker.front_what(), "");
}

TEST(OpTracker, TheClockStartsWhenTheOperationRuns) {
  OpTracker tracker;
  Op op = make_op("all_reduce on group 'tp/0' (rank 0 of 2)", 5000);
  tracker.add(op.record);
  // Queued behind compute for far longer than the timeout: not a communication timeout.
  EXPECT_FALSE(tracker.poll(kT0));
  EXPECT_FALSE(tracker.poll(kT0 + milliseconds(60000)));
  op.state->phase = Phase::kRunning;
  EXPECT_FALSE(tracker.poll(kT0 + milliseconds(60000)));  // started now
  EXPECT_FALSE(tracker.poll(kT0 + milliseconds(64999)));
  std::optional<Failure> f = tracker.poll(kT0 + milliseconds(65000));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, Code::kDeadlineExceeded);
  EXPECT_TRUE(has(f->message, "all_reduce on group 'tp/0' (rank 0 of 2): timed out after 5 s"))
      << f->message;
  EXPECT_TRUE(has(f->message, "parallel.timeout_s")) << f->message;
  // poll only reports: the communicator decides (aborts NCCL), then fails the operations.
  EXPECT_FALSE(result_of(*op.record).finished);
}

TEST(OpTracker, TheNextOperationsClockStartsWhenItsTurnComes) {
  OpTracker tracker;
  Op a = make_op("a", 100), b = make_op("b", 100);
  tracker.add(a.record);
  tracker.add(b.record);
  a.state->phase = Phase::kRunning;
  b.state->phase = Phase::kRunning;  // inputs ready, but it runs after `a`
  EXPECT_FALSE(tracker.poll(kT0));
  a.state->phase = Phase::kDone;
  EXPECT_FALSE(tracker.poll(kT0 + milliseconds(90)));  // `b` starts here
  EXPECT_FALSE(tracker.poll(kT0 + milliseconds(150)));
  std::optional<Failure> f = tracker.poll(kT0 + milliseconds(190));
  ASSERT_TRUE(f);
  EXPECT_TRUE(has(f->message, "b: timed out after 100 ms")) << f->message;
}

TEST(OpTracker, ADeviceErrorIsInternal) {
  OpTracker tracker;
  Op op = make_op("broadcast on group 'dp/1' (rank 1 of 2)", 1000);
  tracker.add(op.record);
  op.state->phase = Phase::kError;
  std::optional<Failure> f = tracker.poll(kT0);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, Code::kInternal);
  EXPECT_TRUE(has(f->message, "broadcast on group 'dp/1' (rank 1 of 2): the GPU reported an error"))
      << f->message;
  EXPECT_TRUE(has(f->message, "cudaErrorIllegalAddress")) << f->message;
}

TEST(OpTracker, FailFinishesEveryPendingOperationAndLaterOnesAtOnce) {
  OpTracker tracker;
  Op a = make_op("a", 1000), b = make_op("b", 1000);
  tracker.add(a.record);
  tracker.add(b.record);
  const Failure failure{Code::kAborted, "a: NCCL reported an error"};
  EXPECT_TRUE(tracker.fail(failure));
  EXPECT_FALSE(tracker.fail(Failure{Code::kInternal, "second"}));  // the first one stays
  EXPECT_EQ(tracker.pending(), 0u);
  for (const Op* op : {&a, &b}) {
    Result r = result_of(*op->record);
    ASSERT_TRUE(r.finished && r.failure);
    EXPECT_EQ(r.failure->code, Code::kAborted);
    EXPECT_EQ(r.failure->message, failure.message);
  }
  Op late = make_op("late", 1000);
  tracker.add(late.record);
  Result r = result_of(*late.record);
  ASSERT_TRUE(r.finished && r.failure);
  EXPECT_EQ(r.failure->message, failure.message);
  EXPECT_FALSE(tracker.poll(kT0));
  ASSERT_TRUE(tracker.failure());
  EXPECT_EQ(tracker.failure()->code, Code::kAborted);
}

TEST(OpTracker, TheFirstRefusalCarriesTheFailuresCodeThenFailedPrecondition) {
  OpTracker tracker;
  EXPECT_FALSE(tracker.refusal("x"));
  tracker.fail(Failure{Code::kDeadlineExceeded, "all_reduce on group 'tp/0': timed out"});
  std::optional<Failure> first = tracker.refusal("broadcast on group 'tp/0'");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->code, Code::kDeadlineExceeded);
  EXPECT_EQ(first->message, "all_reduce on group 'tp/0': timed out");
  std::optional<Failure> second = tracker.refusal("send on group 'tp/0'");
  ASSERT_TRUE(second);
  EXPECT_EQ(second->code, Code::kFailedPrecondition);
  EXPECT_TRUE(has(second->message,
                  "send on group 'tp/0': this communicator is unusable after an "
                  "earlier failure (all_reduce on group 'tp/0': timed out)"))
      << second->message;
}

TEST(OpTracker, AFailureReportedByItsCallerIsNotReportedAgain) {
  OpTracker tracker;
  tracker.fail(Failure{Code::kDeadlineExceeded, "queueing timed out"}, /*reported=*/true);
  std::optional<Failure> next = tracker.refusal("next");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->code, Code::kFailedPrecondition);
}

TEST(OpTracker, MarkReportedCountsOnlyAfterAFailure) {
  OpTracker tracker;
  tracker.mark_reported();  // usable: nothing to note
  tracker.fail(Failure{Code::kAborted, "peer gone"});
  std::optional<Failure> first = tracker.refusal("x");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->code, Code::kAborted);

  OpTracker told;
  told.fail(Failure{Code::kAborted, "peer gone"});
  told.mark_reported();
  std::optional<Failure> next = told.refusal("x");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->code, Code::kFailedPrecondition);
}

TEST(OpTracker, WaitIdle) {
  OpTracker tracker;
  EXPECT_TRUE(tracker.wait_idle(Clock::now()));
  Op op = make_op("a", 1000);
  tracker.add(op.record);
  EXPECT_FALSE(tracker.wait_idle(Clock::now() + milliseconds(20)));
  std::thread finisher([&] {
    std::this_thread::sleep_for(milliseconds(20));
    op.state->phase = Phase::kDone;
    tracker.poll(Clock::now());
  });
  EXPECT_TRUE(tracker.wait_idle(Clock::now() + milliseconds(10000)));
  finisher.join();
}

TEST(AwaitOp, StreamOrderedByDefault) {
  Op op = make_op("a", 1000);
  // Not finished on the device: the caller's stream is ordered after it, the host goes on.
  EXPECT_EQ(outcome(await_op(*op.record, false)).code, Code::kOk);
  EXPECT_EQ(op.state->ordered.load(), 1);
}

TEST(AwaitOp, AKnownFailureIsReturnedWithoutOrdering) {
  Op op = make_op("a", 1000);
  op.record->finish(Failure{Code::kAborted, "a: peer gone"});
  Outcome o = outcome(await_op(*op.record, false));
  EXPECT_EQ(o.code, Code::kAborted);
  EXPECT_EQ(o.message, "a: peer gone");
  EXPECT_EQ(op.state->ordered.load(), 0);
}

TEST(AwaitOp, AStreamTheDeviceRefusesIsInternal) {
  Op op = make_op("all_gather on group 'g' (rank 0 of 1)", 1000);
  op.state->refuse_order = true;
  Outcome o = outcome(await_op(*op.record, false));
  EXPECT_EQ(o.code, Code::kInternal);
  EXPECT_TRUE(has(o.message, "all_gather on group 'g' (rank 0 of 1): cudaStreamWaitEvent"))
      << o.message;
}

TEST(AwaitOp, BlockingWaitsForTheDevice) {
  Op op = make_op("a", 1000);
  std::thread device([&] {
    std::this_thread::sleep_for(milliseconds(30));
    op.state->phase = Phase::kDone;
  });
  const auto start = Clock::now();
  EXPECT_EQ(outcome(await_op(*op.record, true)).code, Code::kOk);
  EXPECT_GE(Clock::now() - start, milliseconds(25));
  device.join();
}

// What the watchdog does to a hung operation reaches a host blocked in wait.
TEST(AwaitOp, BlockingReturnsTheWatchdogsFailure) {
  OpTracker tracker;
  Op op = make_op("all_reduce on group 'dp/0' (rank 1 of 2)", 50);
  tracker.add(op.record);
  op.state->phase = Phase::kRunning;
  std::atomic<bool> stop{false};
  std::thread watchdog([&] {
    while (!stop) {
      if (std::optional<Failure> f = tracker.poll(Clock::now())) tracker.fail(*f);
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  Outcome o = outcome(await_op(*op.record, true));
  stop = true;
  watchdog.join();
  EXPECT_EQ(o.code, Code::kDeadlineExceeded);
  EXPECT_TRUE(has(o.message, "all_reduce on group 'dp/0' (rank 1 of 2): timed out after 50 ms"))
      << o.message;
}

TEST(NcclWork, WaitIsLatchedAndDoneFollowsTheDevice) {
  Op op = make_op("a", 1000);
  auto* work = new NcclWork(op.record, false);
  EXPECT_FALSE(work->done());
  EXPECT_EQ(outcome(work->wait()).code, Code::kOk);
  // A failure found after the first wait does not change what wait() said.
  op.record->finish(Failure{Code::kAborted, "late"});
  EXPECT_EQ(outcome(work->wait()).code, Code::kOk);
  EXPECT_TRUE(work->done());
  EXPECT_EQ(op.state->ordered.load(), 1);
  work->destroy();
  EXPECT_EQ(op.state->ordered.load(), 1);  // waited already: destroying orders nothing more
}

TEST(NcclWork, DestroyingAnUnwaitedHandleOrdersTheCallersStream) {
  Op op = make_op("a", 1000);
  (new NcclWork(op.record, false))->destroy();
  EXPECT_EQ(op.state->ordered.load(), 1);
}

TEST(NcclWork, DoneOnceTheDeviceFinished) {
  Op op = make_op("a", 1000);
  auto* work = new NcclWork(op.record, false);
  EXPECT_FALSE(work->done());
  op.state->phase = Phase::kDone;
  EXPECT_TRUE(work->done());
  work->destroy();
}

}  // namespace
}  // namespace loom::comm_nccl
