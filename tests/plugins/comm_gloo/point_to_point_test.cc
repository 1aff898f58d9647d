// Tagged send/recv of comm_backend "gloo": both directions, several tags, a ring.
#include <gtest/gtest.h>

#include "tests/plugins/comm_gloo/comm_env.h"

namespace loom::testing {
namespace {

TEST(PointToPoint, BothDirectionsWithTags) {
  InMemoryStore store;
  Group group = connect_group(2, "p2p", store);
  ASSERT_FALSE(HasFailure());
  std::vector<Outcome> outcomes;
  std::mutex mutex;
  auto check = [&](Status s) {
    Outcome o = outcome(s);
    std::lock_guard<std::mutex> lock(mutex);
    outcomes.push_back(o);
  };
  HostTensor ping(DType::kF32, 6), pong(DType::kI64, 3), tagged_a(DType::kF16, 2),
      tagged_b(DType::kF16, 2);
  run_ranks(2, [&](int r) {
    if (r == 0) {
      HostTensor out(DType::kF32, 6);
      for (size_t i = 0; i < 6; ++i) out.set(i, 1.5 * i);
      TensorView v = out.view();
      check(group[0].send(&v, 1, 3, nullptr));
      TensorView p = pong.view();
      check(group[0].recv(&p, 1, 4, nullptr));
      // Two messages to one peer with different tags, received in the order sent.
      HostTensor a(DType::kF16, 2), b(DType::kF16, 2);
      a.set(0, 1), a.set(1, 2), b.set(0, 3), b.set(1, 4);
      TensorView va = a.view(), vb = b.view();
      check(group[0].send(&va, 1, 10, nullptr));
      check(group[0].send(&vb, 1, 11, nullptr));
    } else {
      TensorView v = ping.view();
      check(group[1].recv(&v, 0, 3, nullptr));
      HostTensor back(DType::kI64, 3);
      for (size_t i = 0; i < 3; ++i) back.set(i, -static_cast<double>(i) - 100);
      TensorView b = back.view();
      check(group[1].send(&b, 0, 4, nullptr));
      TensorView ta = tagged_a.view(), tb = tagged_b.view();
      check(group[1].recv(&ta, 0, 10, nullptr));
      check(group[1].recv(&tb, 0, 11, nullptr));
    }
  });
  for (const Outcome& o : outcomes) ASSERT_EQ(o.code, Code::kOk) << o.message;
  EXPECT_EQ(ping.values(), (std::vector<double>{0, 1.5, 3, 4.5, 6, 7.5}));
  EXPECT_EQ(pong.values(), (std::vector<double>{-100, -101, -102}));
  EXPECT_EQ(tagged_a.values(), (std::vector<double>{1, 2}));
  EXPECT_EQ(tagged_b.values(), (std::vector<double>{3, 4}));
}

// Every rank passes a message to the next (a pipeline's activations): even ranks send
// first, odd ranks receive first, since a send completes when its recv is posted.
TEST(PointToPoint, Ring) {
  for (int size : {2, 3, 4}) {
    InMemoryStore store;
    Group group = connect_group(size, "ring/" + std::to_string(size), store);
    ASSERT_FALSE(HasFailure());
    std::vector<HostTensor> got(size, HostTensor(DType::kF64, 4));
    std::vector<Outcome> sent(size), received(size);
    run_ranks(size, [&](int r) {
      HostTensor mine(DType::kF64, 4);
      for (size_t i = 0; i < 4; ++i) mine.set(i, r * 10.0 + i);
      TensorView out = mine.view(), in = got[r].view();
      const int next = (r + 1) % size, prev = (r + size - 1) % size;
      if (r % 2 == 0) {
        sent[r] = outcome(group[r].send(&out, next, 7, nullptr));
        received[r] = outcome(group[r].recv(&in, prev, 7, nullptr));
      } else {
        received[r] = outcome(group[r].recv(&in, prev, 7, nullptr));
        sent[r] = outcome(group[r].send(&out, next, 7, nullptr));
      }
    });
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(sent[r].code, Code::kOk) << sent[r].message;
      ASSERT_EQ(received[r].code, Code::kOk) << received[r].message;
      const int prev = (r + size - 1) % size;
      for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[r].get(i), prev * 10.0 + i);
    }
  }
}

TEST(PointToPoint, BadPeerIsInvalidArgument) {
  InMemoryStore store;
  Group group = connect_group(2, "p2p_bad", store);
  ASSERT_FALSE(HasFailure());
  HostTensor t(DType::kF32, 2);
  TensorView v = t.view();
  Outcome self = outcome(group[0].send(&v, 0, 1, nullptr));
  EXPECT_EQ(self.code, Code::kInvalidArgument);
  EXPECT_NE(self.message.find("send on group 'p2p_bad' (rank 0 of 2)"), std::string::npos)
      << self.message;
  Outcome outside = outcome(group[1].recv(&v, 5, 1, nullptr));
  EXPECT_EQ(outside.code, Code::kInvalidArgument);
  EXPECT_NE(outside.message.find("recv"), std::string::npos) << outside.message;
}

}  // namespace
}  // namespace loom::testing
