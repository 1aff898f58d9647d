// DeviceDispatchCommunicator: host tensors go to the CPU backend's communicator, device
// tensors to the device backend's, in every operation (sync and async); a call mixing the
// two, or naming a third device family, is refused with a message naming the group.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/parallel/device_dispatch_communicator.h"
#include "loom/cpp/comm_work.h"
#include "loom/cpp/tensor.h"

namespace loom::core {
namespace {

// Records the operations it is asked for.
class Recorder final : public Object<ICommunicator> {
 public:
  explicit Recorder(std::vector<std::string>* log, std::string name)
      : log_(log), name_(std::move(name)) {}
  int32_t rank() const noexcept override { return 0; }
  int32_t size() const noexcept override { return 2; }
  Status all_reduce(TensorView*, ReduceOp, void*) noexcept override { return note("all_reduce"); }
  Status reduce_scatter(const TensorView*, TensorView*, ReduceOp, void*) noexcept override {
    return note("reduce_scatter");
  }
  Status all_gather(const TensorView*, TensorView*, void*) noexcept override {
    return note("all_gather");
  }
  Status broadcast(TensorView*, int32_t, void*) noexcept override { return note("broadcast"); }
  Status all_to_all(const TensorView*, const int64_t*, const int64_t*, TensorView*, const int64_t*,
                    const int64_t*, void*) noexcept override {
    return note("all_to_all");
  }
  Status send(const TensorView*, int32_t, int32_t, void*) noexcept override { return note("send"); }
  Status recv(TensorView*, int32_t, int32_t, void*) noexcept override { return note("recv"); }
  Status barrier() noexcept override { return note("barrier"); }
  void set_timeout_ms(int64_t ms) noexcept override { timeout = ms; }
  Status all_reduce_async(TensorView*, ReduceOp, void*, ICommWork** out) noexcept override {
    return completed_work(note("all_reduce_async"), out);
  }
  Status reduce_scatter_async(const TensorView*, TensorView*, ReduceOp, void*,
                              ICommWork** out) noexcept override {
    return completed_work(note("reduce_scatter_async"), out);
  }
  Status all_gather_async(const TensorView*, TensorView*, void*,
                          ICommWork** out) noexcept override {
    return completed_work(note("all_gather_async"), out);
  }
  Status broadcast_async(TensorView*, int32_t, void*, ICommWork** out) noexcept override {
    return completed_work(note("broadcast_async"), out);
  }
  Status send_async(const TensorView*, int32_t, int32_t, void*, ICommWork** out) noexcept override {
    return completed_work(note("send_async"), out);
  }
  Status recv_async(TensorView*, int32_t, int32_t, void*, ICommWork** out) noexcept override {
    return completed_work(note("recv_async"), out);
  }
  int64_t timeout = 0;

 private:
  Status note(const char* op) {
    log_->push_back(name_ + ":" + op);
    return ok_status();
  }
  std::vector<std::string>* log_;
  std::string name_;
};

class DeviceDispatchTest : public ::testing::Test {
 protected:
  DeviceDispatchTest()
      : host_(new Recorder(&log_, "gloo")),
        device_(new Recorder(&log_, "nccl")),
        comm_(host_, device_, DeviceType::kCuda, "dp/0") {}
  TensorView on(DeviceType t) { return make_view(buffer_, DType::kF32, {4}, Device{t, 0}); }
  void expect_ok(Status s) {
    EXPECT_EQ(s.code, Code::kOk) << (s.message ? s.message : "");
    status_release(&s);
  }
  // Issues an asynchronous call (`issue(&handle)`) and waits for its handle.
  template <class Issue>
  void expect_async_ok(Issue&& issue) {
    ICommWork* work = nullptr;
    expect_ok(issue(&work));
    ASSERT_NE(work, nullptr);
    expect_ok(work->wait());
    work->destroy();
  }
  float buffer_[4] = {};
  std::vector<std::string> log_;
  Recorder* host_;
  Recorder* device_;
  DeviceDispatchCommunicator comm_;
};

TEST_F(DeviceDispatchTest, EachTensorGoesToItsDevicesBackend) {
  for (DeviceType t : {DeviceType::kCpu, DeviceType::kCuda}) {
    std::string who = t == DeviceType::kCpu ? "gloo:" : "nccl:";
    TensorView a = on(t), b = on(t);
    int64_t counts[2] = {2, 2}, offsets[2] = {0, 2};
    log_.clear();
    expect_ok(comm_.all_reduce(&a, ReduceOp::kSum, nullptr));
    expect_ok(comm_.reduce_scatter(&a, &b, ReduceOp::kSum, nullptr));
    expect_ok(comm_.all_gather(&a, &b, nullptr));
    expect_ok(comm_.broadcast(&a, 0, nullptr));
    expect_ok(comm_.all_to_all(&a, counts, offsets, &b, counts, offsets, nullptr));
    expect_ok(comm_.send(&a, 1, 0, nullptr));
    expect_ok(comm_.recv(&a, 1, 0, nullptr));
    expect_async_ok(
        [&](ICommWork** w) { return comm_.all_reduce_async(&a, ReduceOp::kSum, nullptr, w); });
    expect_async_ok([&](ICommWork** w) {
      return comm_.reduce_scatter_async(&a, &b, ReduceOp::kSum, nullptr, w);
    });
    expect_async_ok([&](ICommWork** w) { return comm_.all_gather_async(&a, &b, nullptr, w); });
    expect_async_ok([&](ICommWork** w) { return comm_.broadcast_async(&a, 0, nullptr, w); });
    expect_async_ok([&](ICommWork** w) { return comm_.send_async(&a, 1, 0, nullptr, w); });
    expect_async_ok([&](ICommWork** w) { return comm_.recv_async(&a, 1, 0, nullptr, w); });
    std::vector<std::string> want;
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all",
                           "send", "recv", "all_reduce_async", "reduce_scatter_async",
                           "all_gather_async", "broadcast_async", "send_async", "recv_async"})
      want.push_back(who + op);
    EXPECT_EQ(log_, want);
  }
}

TEST_F(DeviceDispatchTest, BarrierAndTimeoutReachBoth) {
  expect_ok(comm_.barrier());
  EXPECT_EQ(log_, (std::vector<std::string>{"nccl:barrier", "gloo:barrier"}));
  comm_.set_timeout_ms(1234);
  EXPECT_EQ(host_->timeout, 1234);
  EXPECT_EQ(device_->timeout, 1234);
  EXPECT_EQ(comm_.size(), 2);
}

TEST_F(DeviceDispatchTest, MixedOrForeignDevicesAreRefused) {
  TensorView h = on(DeviceType::kCpu), d = on(DeviceType::kCuda);
  Status s = comm_.all_gather(&h, &d, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&s),
              ::testing::HasSubstr("all_gather on group 'dp/0': input in cpu memory and output "
                                   "in cuda memory"));
  TensorView odd = on(static_cast<DeviceType>(7));
  s = comm_.all_reduce(&odd, ReduceOp::kSum, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&s), ::testing::HasSubstr("no communicator for unknown tensors"));
  EXPECT_TRUE(log_.empty());
}

}  // namespace
}  // namespace loom::core
