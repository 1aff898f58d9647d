// BucketReadiness: the bookkeeping that decides when a gradient bucket may be reduced
// during backward. Buckets are released once every parameter in them is final, strictly in
// index order, each once; frozen parameters are final from the start.
#include "core/optim/bucket_readiness.h"

#include <gtest/gtest.h>

#include <vector>

#include "loom/cpp/error.h"

namespace loom::core {
namespace {

using Buckets = std::vector<size_t>;

// Three modules (ids a, b, c) with five parameters:
//   a: 0, 1   b: 2, 3   c: 4
// in three buckets in backward order: {4, 3}, {2, 1}, {0}.
struct Fixture {
  int a = 0, b = 0, c = 0;
  BucketReadiness make(std::vector<bool> final = {}) {
    return BucketReadiness({&a, &a, &b, &b, &c}, {{4, 3}, {2, 1}, {0}}, std::move(final));
  }
};

TEST(BucketReadiness, ReleasesBucketsWhenEveryParameterIsFinal) {
  Fixture f;
  BucketReadiness r = f.make();
  EXPECT_EQ(r.bucket_count(), 3u);
  EXPECT_EQ(r.mark(&f.c), Buckets{});   // bucket 0 still waits for parameter 3 (b)
  EXPECT_EQ(r.mark(&f.b), Buckets{0});  // bucket 1 waits for parameter 1 (a)
  EXPECT_EQ(r.released(), 1u);
  EXPECT_EQ(r.mark(&f.a), (Buckets{1, 2}));
  EXPECT_EQ(r.released(), 3u);
  EXPECT_EQ(r.release_rest(), Buckets{});
}

TEST(BucketReadiness, ReleasesInIndexOrderEvenWhenALaterBucketIsFinalFirst) {
  Fixture f;
  BucketReadiness r = f.make();
  // a's parameters fill bucket 2 and half of bucket 1: bucket 2 is final but waits.
  EXPECT_EQ(r.mark(&f.a), Buckets{});
  EXPECT_EQ(r.released(), 0u);
  EXPECT_EQ(r.mark(&f.c), Buckets{});
  EXPECT_EQ(r.mark(&f.b), (Buckets{0, 1, 2}));
}

TEST(BucketReadiness, RepeatedAndUnknownSignalsChangeNothing) {
  Fixture f;
  BucketReadiness r = f.make();
  int stranger = 0;
  EXPECT_EQ(r.mark(&stranger), Buckets{});
  EXPECT_EQ(r.mark(nullptr), Buckets{});
  EXPECT_EQ(r.mark(&f.c), Buckets{});
  EXPECT_EQ(r.mark(&f.c), Buckets{});  // c again does not stand in for b
  EXPECT_EQ(r.released(), 0u);
  EXPECT_EQ(r.mark(&f.b), Buckets{0});
  EXPECT_EQ(r.mark(&f.b), Buckets{});  // nothing is released twice
}

TEST(BucketReadiness, ReleaseRestHandsOverWhatIsLeftInOrder) {
  Fixture f;
  BucketReadiness r = f.make();
  EXPECT_EQ(r.mark(&f.c), Buckets{});
  EXPECT_EQ(r.release_rest(), (Buckets{0, 1, 2}));  // backward is over: final or not
  EXPECT_EQ(r.mark(&f.b), Buckets{});
  EXPECT_EQ(r.release_rest(), Buckets{});
  r.reset();
  EXPECT_EQ(r.released(), 0u);
  EXPECT_EQ(r.release_rest(), (Buckets{0, 1, 2}));
}

TEST(BucketReadiness, ResetStartsANewBackwardPass) {
  Fixture f;
  BucketReadiness r = f.make();
  EXPECT_EQ(r.mark(&f.c), Buckets{});
  EXPECT_EQ(r.mark(&f.b), Buckets{0});
  r.reset();  // the next step: nothing is final any more
  EXPECT_EQ(r.mark(&f.b), Buckets{});
  EXPECT_EQ(r.mark(&f.c), Buckets{0});
}

TEST(BucketReadiness, FrozenParametersAreFinalFromTheStart) {
  Fixture f;
  // Parameter 3 (b) and 4 (c) frozen: bucket 0 needs no signal, and a signal of anybody
  // releases it; parameter 1 frozen too: bucket 1 waits only for 2 (b).
  BucketReadiness r = f.make({false, true, false, true, true});
  EXPECT_EQ(r.mark(&f.a), Buckets{0});
  EXPECT_EQ(r.mark(&f.b), (Buckets{1, 2}));
  r.reset();
  EXPECT_EQ(r.mark(&f.c), Buckets{0});
  EXPECT_EQ(r.release_rest(), (Buckets{1, 2}));
}

TEST(BucketReadiness, ParametersInNoBucketAreIgnored) {
  int a = 0, b = 0;
  // Parameter 1 (b) is in no bucket.
  BucketReadiness r({&a, &b}, {{0}});
  EXPECT_EQ(r.mark(&a), Buckets{0});
  EXPECT_EQ(r.mark(&b), Buckets{});
}

TEST(BucketReadiness, BadMembershipIsAnInternalError) {
  int a = 0;
  EXPECT_THROW(BucketReadiness({&a}, {{0}, {0}}), Error);  // in two buckets
  EXPECT_THROW(BucketReadiness({&a}, {{1}}), Error);       // no such parameter
  EXPECT_THROW(BucketReadiness({&a}, {{0}}, {true, false}), Error);
}

}  // namespace
}  // namespace loom::core
