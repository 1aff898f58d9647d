// What comm_backend "gloo" reports when something is wrong: bad arguments (kInvalidArgument,
// communicator still usable), CUDA (kUnimplemented), a rank that never joins
// (kDeadlineExceeded), a rank that goes away (kAborted), and use after a failure
// (kFailedPrecondition). None of them hangs.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/plugins/comm_gloo/comm_env.h"

namespace loom::testing {
namespace {

using Clock = std::chrono::steady_clock;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Errors, BadShapesAndDtypesAreInvalidArgumentAndLeaveTheCommunicatorUsable) {
  InMemoryStore store;
  Group group = connect_group(2, "bad/0", store);
  ASSERT_FALSE(HasFailure());
  std::vector<std::vector<Outcome>> outcomes(2);
  std::vector<HostTensor> after(2, HostTensor(DType::kF32, 3));
  run_ranks(2, [&](int r) {
    auto& o = outcomes[r];
    ICommunicator& c = group[r];
    HostTensor seven(DType::kF32, 7), three(DType::kF32, 3), six_i32(DType::kI32, 6),
        i16(DType::kI16, 4), i32(DType::kI32, 4);
    TensorView v7 = seven.view(), v3 = three.view(), v6 = six_i32.view(), vi16 = i16.view(),
               vi32 = i32.view();
    o.push_back(outcome(c.reduce_scatter(&v7, &v3, ReduceOp::kSum, nullptr)));  // 0
    o.push_back(outcome(c.all_gather(&v3, &v7, nullptr)));                      // 1
    o.push_back(outcome(c.all_reduce(&vi16, ReduceOp::kSum, nullptr)));         // 2
    o.push_back(outcome(c.all_reduce(&vi32, ReduceOp::kAvg, nullptr)));         // 3
    o.push_back(outcome(c.all_gather(&v3, &v6, nullptr)));                      // 4: dtypes
    TensorView strided = v7;
    strided.shape[0] = 3;
    strided.strides[0] = 2;
    o.push_back(outcome(c.all_reduce(&strided, ReduceOp::kSum, nullptr)));  // 5
    TensorView cuda = v3;
    cuda.device = Device{DeviceType::kCuda, 0};
    o.push_back(outcome(c.broadcast(&cuda, 0, nullptr)));  // 6
    o.push_back(outcome(c.broadcast(&v3, 2, nullptr)));    // 7: root
    // Still usable after all of these.
    for (size_t i = 0; i < 3; ++i) after[r].set(i, r + 1.0);
    TensorView a = after[r].view();
    o.push_back(outcome(c.all_reduce(&a, ReduceOp::kSum, nullptr)));  // 8
  });
  for (int r = 0; r < 2; ++r) {
    auto& o = outcomes[r];
    ASSERT_EQ(o.size(), 9u);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(o[i].code, Code::kInvalidArgument) << i;
    const std::string where = "on group 'bad/0' (rank " + std::to_string(r) + " of 2)";
    EXPECT_TRUE(has(o[0].message, "reduce_scatter " + where)) << o[0].message;
    EXPECT_TRUE(has(o[0].message, "(7)") && has(o[0].message, "(3)")) << o[0].message;
    EXPECT_TRUE(has(o[1].message, "all_gather " + where)) << o[1].message;
    EXPECT_TRUE(has(o[1].message, "(7)") && has(o[1].message, "(3)")) << o[1].message;
    EXPECT_TRUE(has(o[2].message, "all_reduce") && has(o[2].message, "i16")) << o[2].message;
    EXPECT_TRUE(has(o[3].message, "all_reduce") && has(o[3].message, "avg")) << o[3].message;
    EXPECT_TRUE(has(o[4].message, "all_gather") && has(o[4].message, "i32")) << o[4].message;
    EXPECT_TRUE(has(o[5].message, "contiguous")) << o[5].message;
    EXPECT_TRUE(has(o[6].message, "comm_nccl")) << o[6].message;
    EXPECT_TRUE(has(o[7].message, "root 2")) << o[7].message;
    EXPECT_EQ(o[8].code, Code::kOk) << o[8].message;
    EXPECT_EQ(after[r].values(), (std::vector<double>{3, 3, 3}));
  }
}

TEST(Errors, CudaCommunicatorIsUnimplemented) {
  ObjectPtr backend = make_backend();
  InMemoryStore store;
  ICommunicator* comm = nullptr;
  Outcome o = outcome(as_backend(backend)->create_communicator(&store, {"tp/0", 4}, 0, 2,
                                                               DeviceType::kCuda, &comm));
  EXPECT_EQ(o.code, Code::kUnimplemented);
  EXPECT_TRUE(has(o.message, "comm_nccl") && has(o.message, "'tp/0'")) << o.message;
  EXPECT_EQ(comm, nullptr);
}

TEST(Errors, HostnameAndInterfaceTogetherAreRejected) {
  try {
    make_backend({{"impl", "gloo"}, {"hostname", "127.0.0.1"}, {"interface", "lo"}});
    ADD_FAILURE() << "built a backend with both hostname and interface";
  } catch (const std::exception& e) {
    EXPECT_TRUE(has(e.what(), "interface") && has(e.what(), "not both")) << e.what();
  }
}

TEST(Errors, SizeOneNeedsNoStoreOrPeer) {
  ObjectPtr backend = make_backend({{"impl", "gloo"}, {"interface", "no_such_if0"}});
  ICommunicator* raw = nullptr;
  Outcome o = outcome(
      as_backend(backend)->create_communicator(nullptr, {"solo", 4}, 0, 1, DeviceType::kCpu, &raw));
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  CommPtr comm(raw);
  HostTensor t(DType::kF32, 2);
  t.set(0, 3), t.set(1, 5);
  TensorView v = t.view();
  EXPECT_EQ(outcome(comm->all_reduce(&v, ReduceOp::kAvg, nullptr)).code, Code::kOk);
  EXPECT_EQ(outcome(comm->barrier()).code, Code::kOk);
  EXPECT_EQ(t.values(), (std::vector<double>{3, 5}));
}

TEST(Errors, BadInterfaceIsUnavailableNamingTheOption) {
  ObjectPtr backend = make_backend({{"impl", "gloo"}, {"interface", "no_such_if0"}});
  InMemoryStore store;
  ICommunicator* raw = nullptr;
  Outcome o = outcome(
      as_backend(backend)->create_communicator(&store, {"g", 1}, 0, 2, DeviceType::kCpu, &raw));
  EXPECT_NE(o.code, Code::kOk);
  EXPECT_TRUE(has(o.message, "no_such_if0")) << o.message;
  EXPECT_EQ(raw, nullptr);
}

// Rank 0 never enters the all_reduce: the others give up after their timeout.
TEST(Errors, MissingRankTimesOut) {
  InMemoryStore store;
  Group group = connect_group(3, "tmo/0", store);
  ASSERT_FALSE(HasFailure());
  constexpr int64_t kTimeoutMs = 1500;
  std::vector<Outcome> outcomes(3), later(3);
  std::vector<double> seconds(3);
  run_ranks(3, [&](int r) {
    if (r == 0) return;
    group[r].set_timeout_ms(kTimeoutMs);
    HostTensor t(DType::kF32, 1000);
    TensorView v = t.view();
    auto start = Clock::now();
    outcomes[r] = outcome(group[r].all_reduce(&v, ReduceOp::kSum, nullptr));
    seconds[r] = std::chrono::duration<double>(Clock::now() - start).count();
    later[r] = outcome(group[r].barrier());
  });
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(outcomes[r].code, Code::kDeadlineExceeded) << outcomes[r].message;
    EXPECT_TRUE(has(outcomes[r].message, "all_reduce on group 'tmo/0' (rank " + std::to_string(r) +
                                             " of 3): timed out after 1.5 s"))
        << outcomes[r].message;
    EXPECT_TRUE(has(outcomes[r].message, "parallel.timeout_s")) << outcomes[r].message;
    EXPECT_LT(seconds[r], kTimeoutMs / 1000.0 + 2.0);
    // A failed communicator refuses further work instead of hanging.
    EXPECT_EQ(later[r].code, Code::kFailedPrecondition) << later[r].message;
    EXPECT_TRUE(has(later[r].message, "barrier on group 'tmo/0'") &&
                has(later[r].message, "earlier failure"))
        << later[r].message;
  }
}

// Rank 0's communicator is destroyed while the others are inside an all_reduce with it.
TEST(Errors, DeadPeerAbortsTheOthers) {
  InMemoryStore store;
  Group group = connect_group(3, "dead/0", store);
  ASSERT_FALSE(HasFailure());
  constexpr int64_t kTimeoutMs = 8000;
  std::vector<Outcome> outcomes(3);
  std::vector<double> seconds(3);
  run_ranks(3, [&](int r) {
    group[r].set_timeout_ms(kTimeoutMs);
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      group.comms[0].reset();  // IObject::destroy
      return;
    }
    HostTensor t(DType::kF32, 1000);
    TensorView v = t.view();
    auto start = Clock::now();
    outcomes[r] = outcome(group[r].all_reduce(&v, ReduceOp::kSum, nullptr));
    seconds[r] = std::chrono::duration<double>(Clock::now() - start).count();
  });
  for (int r = 1; r < 3; ++r) {
    EXPECT_TRUE(outcomes[r].code == Code::kAborted || outcomes[r].code == Code::kDeadlineExceeded)
        << code_name(outcomes[r].code) << ": " << outcomes[r].message;
    EXPECT_TRUE(has(outcomes[r].message, "all_reduce on group 'dead/0'")) << outcomes[r].message;
    EXPECT_LT(seconds[r], kTimeoutMs / 1000.0 + 2.0);
    std::cout << "rank " << r << " after " << seconds[r] << " s: " << code_name(outcomes[r].code)
              << ": " << outcomes[r].message << "\n";
  }
}

}  // namespace
}  // namespace loom::testing
