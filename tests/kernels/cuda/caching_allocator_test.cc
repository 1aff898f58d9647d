// The caching allocator's policy, on the CPU: a fake raw allocator backed by host memory
// records every driver call, so each test states exactly which calls a sequence of
// allocations must cause and what the figures are after each step.
#include "kernels/cuda/runtime/caching_allocator.h"

#include <gtest/gtest.h>
#include <loom/cpp/error.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace loom::kernels::cuda {
namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;
using CA = CachingAllocator;

// Host memory standing in for the device. Fails on request (the next N calls, or always) or
// when the bytes it has handed out would pass `capacity`. With `misalign`, every segment
// starts 256 bytes past a 512-byte boundary: the weakest alignment a driver may give.
class FakeRawMemory final : public RawMemory {
 public:
  explicit FakeRawMemory(uint64_t capacity = ~uint64_t{0}, bool misalign = false)
      : capacity_(capacity), misalign_(misalign) {}
  ~FakeRawMemory() override {
    EXPECT_TRUE(held_.empty()) << held_.size() << " segments never returned";
    for (auto& [pointer, segment] : held_) ::free(segment.host);
  }

  void* alloc(uint64_t bytes) override {
    alloc_calls.push_back(bytes);
    if (throw_next) {
      throw_next = false;
      throw Error(Code::kInternal, "fake: broken context");
    }
    if (fail_next > 0) {
      --fail_next;
      return nullptr;
    }
    if (fail_always || bytes > capacity_ - outstanding) return nullptr;
    const uint64_t offset = misalign_ ? 256 : 0;
    void* host = aligned_alloc(4096, bytes + (misalign_ ? 4096 : 0));
    if (host == nullptr) return nullptr;
    char* pointer = static_cast<char*>(host) + offset;
    held_[pointer] = Held{host, bytes};
    outstanding += bytes;
    return pointer;
  }

  void free(void* pointer) noexcept override {
    auto it = held_.find(static_cast<char*>(pointer));
    if (it == held_.end()) {
      ADD_FAILURE() << "free of " << pointer << ", which the fake never handed out";
      return;
    }
    free_calls.push_back(it->second.bytes);
    outstanding -= it->second.bytes;
    ::free(it->second.host);
    held_.erase(it);
  }

  // True when [pointer, pointer + bytes) lies inside one segment handed out.
  bool inside_a_segment(const void* pointer, uint64_t bytes) const {
    auto it = held_.upper_bound(static_cast<char*>(const_cast<void*>(pointer)));
    if (it == held_.begin()) return false;
    --it;
    const char* p = static_cast<const char*>(pointer);
    return p + bytes <= it->first + it->second.bytes;
  }

  std::vector<uint64_t> alloc_calls;  // sizes asked for, failed calls included
  std::vector<uint64_t> free_calls;   // sizes returned
  uint64_t outstanding = 0;
  int fail_next = 0;
  bool fail_always = false;
  bool throw_next = false;

 private:
  struct Held {
    void* host;
    uint64_t bytes;
  };
  const uint64_t capacity_;
  const bool misalign_;
  std::map<char*, Held> held_;
};

char* at(void* pointer) { return static_cast<char*>(pointer); }

struct Figures {
  uint64_t allocated, peak_allocated, reserved, peak_reserved;
};

void expect_figures(const CA& allocator, Figures expected, int line) {
  const DeviceMemoryStats s = allocator.stats();
  EXPECT_EQ(s.allocated, expected.allocated) << "line " << line;
  EXPECT_EQ(s.peak_allocated, expected.peak_allocated) << "line " << line;
  EXPECT_EQ(s.reserved, expected.reserved) << "line " << line;
  EXPECT_EQ(s.peak_reserved, expected.peak_reserved) << "line " << line;
}
#define EXPECT_FIGURES(allocator, ...) expect_figures(allocator, Figures{__VA_ARGS__}, __LINE__)

Code code_of(const std::function<void()>& body, std::string* message) {
  try {
    body();
  } catch (const Error& e) {
    *message = e.what();
    return e.code();
  }
  return Code::kOk;
}

TEST(CachingAllocatorTest, ZeroBytesIsNullAndTouchesNothing) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 80 * GiB);
  EXPECT_EQ(allocator.allocate(0), nullptr);
  allocator.deallocate(nullptr);
  EXPECT_TRUE(raw.alloc_calls.empty());
  const DeviceMemoryStats s = allocator.stats();
  EXPECT_EQ(s.num_allocs, 0u);
  EXPECT_EQ(s.total, 80 * GiB);
  EXPECT_FIGURES(allocator, 0, 0, 0, 0);
}

TEST(CachingAllocatorTest, FreedBlockIsReusedWithoutTheDriver) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* a = allocator.allocate(1000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(allocator.block_size(a), 1024u);  // rounded to the 512-byte granule
  EXPECT_EQ(raw.alloc_calls, std::vector<uint64_t>{CA::kSmallSegment});
  allocator.deallocate(a);
  void* b = allocator.allocate(700);
  EXPECT_EQ(b, a);
  EXPECT_EQ(raw.alloc_calls.size(), 1u);
  const DeviceMemoryStats s = allocator.stats();
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.num_driver_allocs, 1u);
  EXPECT_EQ(s.num_cache_flushes, 0u);
  allocator.deallocate(b);
}

TEST(CachingAllocatorTest, StatsAreExactAtEachStep) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 80 * GiB);
  void* a = allocator.allocate(1);  // small: 512 of a 2 MiB segment
  EXPECT_FIGURES(allocator, 512, 512, 2 * MiB, 2 * MiB);
  void* b = allocator.allocate(MiB + 1);  // large: MiB + 512 of a 16 MiB segment
  EXPECT_FIGURES(allocator, MiB + 1024, MiB + 1024, 18 * MiB, 18 * MiB);
  allocator.deallocate(a);
  EXPECT_FIGURES(allocator, MiB + 512, MiB + 1024, 18 * MiB, 18 * MiB);
  void* c = allocator.allocate(3 * MiB);  // from the 16 MiB segment's free rest
  EXPECT_FIGURES(allocator, 4 * MiB + 512, 4 * MiB + 512, 18 * MiB, 18 * MiB);
  EXPECT_EQ(at(c), at(b) + MiB + 512);
  allocator.deallocate(b);
  allocator.deallocate(c);
  EXPECT_FIGURES(allocator, 0, 4 * MiB + 512, 18 * MiB, 18 * MiB);
  EXPECT_EQ(allocator.empty_cache(), 18 * MiB);
  EXPECT_FIGURES(allocator, 0, 4 * MiB + 512, 0, 18 * MiB);
  const DeviceMemoryStats s = allocator.stats();
  EXPECT_EQ(s.num_allocs, 3u);
  EXPECT_EQ(s.num_driver_allocs, 2u);
  EXPECT_EQ(s.total, 80 * GiB);
  EXPECT_EQ(raw.free_calls, (std::vector<uint64_t>{2 * MiB, 16 * MiB}));
}

TEST(CachingAllocatorTest, PeakAndResetPeak) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* a = allocator.allocate(4 * KiB);
  void* b = allocator.allocate(8 * KiB);
  allocator.deallocate(b);
  EXPECT_FIGURES(allocator, 4 * KiB, 12 * KiB, 2 * MiB, 2 * MiB);
  allocator.reset_peak();
  EXPECT_FIGURES(allocator, 4 * KiB, 4 * KiB, 2 * MiB, 2 * MiB);
  void* c = allocator.allocate(KiB);
  EXPECT_FIGURES(allocator, 5 * KiB, 5 * KiB, 2 * MiB, 2 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(c);
  allocator.empty_cache();
  EXPECT_FIGURES(allocator, 0, 5 * KiB, 0, 2 * MiB);
  allocator.reset_peak();
  EXPECT_FIGURES(allocator, 0, 0, 0, 0);
}

TEST(CachingAllocatorTest, SplitsThenCoalescesNeighbours) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  const uint64_t n = 100 * KiB;
  void* a = allocator.allocate(n);
  void* b = allocator.allocate(n);
  void* c = allocator.allocate(n);
  ASSERT_EQ(raw.alloc_calls.size(), 1u);  // all three split from one segment
  EXPECT_EQ(at(b), at(a) + n);
  EXPECT_EQ(at(c), at(b) + n);
  allocator.deallocate(b);
  allocator.deallocate(a);
  // A and B merged: the exact fit for A+B, ahead of the segment's larger free tail.
  void* ab = allocator.allocate(2 * n);
  EXPECT_EQ(ab, a);
  EXPECT_EQ(allocator.block_size(ab), 2 * n);
  EXPECT_EQ(raw.alloc_calls.size(), 1u);
  // Freeing all three leaves one free block: the segment is wholly free again.
  allocator.deallocate(c);
  allocator.deallocate(ab);
  EXPECT_EQ(allocator.empty_cache(), CA::kSmallSegment);
  EXPECT_EQ(raw.free_calls, std::vector<uint64_t>{CA::kSmallSegment});
}

TEST(CachingAllocatorTest, MergesWithTheRightNeighbourToo) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* a = allocator.allocate(KiB);
  void* b = allocator.allocate(KiB);
  void* c = allocator.allocate(KiB);
  allocator.deallocate(a);
  allocator.deallocate(b);  // merges left into a
  allocator.deallocate(c);  // merges left into a+b and right into the tail
  void* whole = allocator.allocate(CA::kSmallRequestMax);
  EXPECT_EQ(whole, a);
  void* rest = allocator.allocate(CA::kSmallRequestMax);  // the segment's second half
  EXPECT_EQ(at(rest), at(a) + CA::kSmallRequestMax);
  EXPECT_EQ(raw.alloc_calls.size(), 1u);
  allocator.deallocate(whole);
  allocator.deallocate(rest);
}

TEST(CachingAllocatorTest, TakesTheBestFitAndTheLowestAddressOnTies) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  // Free holes of 3, 1, 2 and 2 KiB, each walled in by a live 512-byte block.
  std::vector<void*> holes, walls;
  for (uint64_t kib : {3, 1, 2, 2}) {
    holes.push_back(allocator.allocate(kib * KiB));
    walls.push_back(allocator.allocate(512));
  }
  for (void* hole : holes) allocator.deallocate(hole);
  void* p = allocator.allocate(1500);  // 1536: the first 2 KiB hole, leaving 512 there
  EXPECT_EQ(p, holes[2]);
  void* q = allocator.allocate(KiB);  // the 1 KiB hole, exactly
  EXPECT_EQ(q, holes[1]);
  void* r = allocator.allocate(2 * KiB);  // the second 2 KiB hole (the first is now 512)
  EXPECT_EQ(r, holes[3]);
  void* s = allocator.allocate(512);  // the 512 left in the first 2 KiB hole
  EXPECT_EQ(at(s), at(holes[2]) + 1536);
  void* t = allocator.allocate(3 * KiB);
  EXPECT_EQ(t, holes[0]);
  EXPECT_EQ(raw.alloc_calls.size(), 1u);
  for (void* x : {p, q, r, s, t}) allocator.deallocate(x);
  for (void* x : walls) allocator.deallocate(x);
}

TEST(CachingAllocatorTest, LargePoolSegmentsAndSplitThreshold) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* a = allocator.allocate(3 * MiB);  // a 16 MiB segment, split
  void* b = allocator.allocate(3 * MiB);  // the same segment
  EXPECT_EQ(raw.alloc_calls, std::vector<uint64_t>{16 * MiB});
  EXPECT_EQ(at(b), at(a) + 3 * MiB);
  // 10 MiB are left: a 9 MiB request leaves exactly 1 MiB, too small for the large pool,
  // so the block keeps it.
  void* c = allocator.allocate(9 * MiB);
  EXPECT_EQ(allocator.block_size(c), 10 * MiB);
  // 17 MiB: a segment of 18 MiB (2 MiB steps); the 1 MiB rest again stays in the block.
  void* d = allocator.allocate(17 * MiB);
  EXPECT_EQ(raw.alloc_calls, (std::vector<uint64_t>{16 * MiB, 18 * MiB}));
  EXPECT_EQ(allocator.block_size(d), 18 * MiB);
  EXPECT_FIGURES(allocator, 34 * MiB, 34 * MiB, 34 * MiB, 34 * MiB);
  // A free large block never serves a small request: the pools do not share segments.
  allocator.deallocate(a);
  void* small = allocator.allocate(KiB);
  EXPECT_EQ(raw.alloc_calls.size(), 3u);
  EXPECT_EQ(raw.alloc_calls.back(), CA::kSmallSegment);
  // A large request of more than 1 MiB below a free block's size splits it.
  void* e = allocator.allocate(MiB + 512);
  EXPECT_EQ(e, a);
  EXPECT_EQ(allocator.block_size(e), MiB + 512);  // the 2 MiB - 512 rest is kept free
  for (void* x : {b, c, d, e, small}) allocator.deallocate(x);
  EXPECT_EQ(allocator.empty_cache(), 36 * MiB);
  EXPECT_EQ(raw.outstanding, 0u);
}

TEST(CachingAllocatorTest, PointersAreAlignedEvenOnWeaklyAlignedSegments) {
  for (bool misalign : {false, true}) {
    FakeRawMemory raw(~uint64_t{0}, misalign);
    CA allocator(&raw, "cuda:0", 0);
    std::mt19937_64 rng(7);
    std::vector<void*> live;
    for (int i = 0; i < 300; ++i) {
      const uint64_t bytes = 1 + rng() % (i % 3 == 0 ? 3 * MiB : 5000);
      void* p = allocator.allocate(bytes);
      const uintptr_t address = reinterpret_cast<uintptr_t>(p);
      EXPECT_EQ(address % CA::kMinAlignment, 0u) << "size " << bytes;
      if (!misalign) {
        EXPECT_EQ(address % CA::kGranule, 0u) << "size " << bytes;
      }
      live.push_back(p);
      if (rng() % 2 == 0) {
        const size_t k = rng() % live.size();
        allocator.deallocate(live[k]);
        live.erase(live.begin() + k);
      }
    }
    for (void* p : live) allocator.deallocate(p);
  }
}

TEST(CachingAllocatorTest, SegmentsBelowTheMinimumAlignmentAreRefused) {
  struct Unaligned final : RawMemory {
    void* alloc(uint64_t bytes) override { return buffer + 16; }
    void free(void* pointer) noexcept override { freed = pointer; }
    alignas(4096) char buffer[4096 + 16];
    void* freed = nullptr;
  };
  // The segment size does not matter: the fake hands out a pointer it never touches.
  Unaligned raw;
  CA allocator(&raw, "cuda:0", 0);
  std::string message;
  EXPECT_EQ(code_of([&] { allocator.allocate(64); }, &message), Code::kInternal);
  EXPECT_NE(message.find("not aligned to 256 bytes"), std::string::npos) << message;
  EXPECT_EQ(raw.freed, raw.buffer + 16);  // handed back, not leaked
  EXPECT_FIGURES(allocator, 0, 0, 0, 0);
}

TEST(CachingAllocatorTest, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeRawMemory raw(4 * MiB);
  CA allocator(&raw, "cuda:0", 4 * MiB);
  void* s1 = allocator.allocate(MiB);
  void* s2 = allocator.allocate(MiB);  // the rest of s1's segment
  void* s3 = allocator.allocate(KiB);  // a second segment: the fake is now full
  allocator.deallocate(s1);
  allocator.deallocate(s2);  // the first segment is wholly free, but cached
  // 1.5 MiB is large: 16 MiB is asked for and refused, the cached segment is returned, and
  // the retry asks for 2 MiB only.
  void* big = allocator.allocate(3 * MiB / 2);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(raw.alloc_calls, (std::vector<uint64_t>{2 * MiB, 2 * MiB, 16 * MiB, 2 * MiB}));
  EXPECT_EQ(raw.free_calls, std::vector<uint64_t>{2 * MiB});
  EXPECT_EQ(allocator.block_size(big), 2 * MiB);  // the 512 KiB rest is not worth a block
  EXPECT_FIGURES(allocator, KiB + 2 * MiB, KiB + 2 * MiB, 4 * MiB, 4 * MiB);
  const DeviceMemoryStats s = allocator.stats();
  EXPECT_EQ(s.num_cache_flushes, 1u);
  EXPECT_EQ(s.num_driver_allocs, 3u);
  EXPECT_EQ(s.num_allocs, 4u);
  allocator.deallocate(big);
  allocator.deallocate(s3);
}

TEST(CachingAllocatorTest, ADriverFailureThatPassesIsRetriedOnce) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* cached = allocator.allocate(KiB);
  allocator.deallocate(cached);
  raw.fail_next = 1;
  void* p = allocator.allocate(8 * MiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(raw.alloc_calls, (std::vector<uint64_t>{2 * MiB, 16 * MiB, 8 * MiB}));
  EXPECT_EQ(raw.free_calls, std::vector<uint64_t>{2 * MiB});  // the cache went first
  EXPECT_EQ(allocator.stats().num_cache_flushes, 1u);
  EXPECT_FIGURES(allocator, 8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB);
  allocator.deallocate(p);
}

TEST(CachingAllocatorTest, OutOfMemoryMessageGivesTheFigures) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:1", 80 * GiB);
  void* held = allocator.allocate(KiB);
  raw.fail_always = true;
  std::string message;
  EXPECT_EQ(code_of([&] { allocator.allocate(5 * MiB); }, &message), Code::kResourceExhausted);
  for (const char* part :
       {"cuda:1: out of memory: cannot allocate 5.00 MiB (5242880 bytes)",
        "a new segment of 6.00 MiB (6291456 bytes)", "returning 0 bytes of cached",
        "allocated 1.00 KiB (1024 bytes)", "reserved 2.00 MiB (2097152 bytes)",
        "device total 80.00 GiB (85899345920 bytes)", "micro-batch size"}) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
  EXPECT_EQ(raw.alloc_calls, (std::vector<uint64_t>{2 * MiB, 16 * MiB, 6 * MiB}));
  const DeviceMemoryStats s = allocator.stats();
  EXPECT_EQ(s.num_allocs, 1u);  // the failure served nothing
  EXPECT_EQ(s.num_cache_flushes, 1u);
  EXPECT_FIGURES(allocator, KiB, KiB, 2 * MiB, 2 * MiB);

  // Absurd sizes fail at once, without asking the driver or wrapping around.
  raw.fail_always = false;
  EXPECT_EQ(code_of([&] { allocator.allocate(~uint64_t{0}); }, &message), Code::kResourceExhausted);
  EXPECT_NE(message.find("more than any device has"), std::string::npos) << message;
  EXPECT_NE(message.find("device total 80.00 GiB"), std::string::npos) << message;
  EXPECT_EQ(raw.alloc_calls.size(), 3u);

  // After all that the allocator still works.
  void* p = allocator.allocate(KiB);
  EXPECT_EQ(at(p), at(held) + KiB);
  allocator.deallocate(p);
  allocator.deallocate(held);
}

TEST(CachingAllocatorTest, ADriverErrorLeavesTheCacheUnchanged) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  raw.throw_next = true;
  std::string message;
  EXPECT_EQ(code_of([&] { allocator.allocate(KiB); }, &message), Code::kInternal);
  EXPECT_EQ(message, "fake: broken context");
  EXPECT_FIGURES(allocator, 0, 0, 0, 0);
  EXPECT_EQ(allocator.stats().num_allocs, 0u);
  void* p = allocator.allocate(KiB);
  EXPECT_NE(p, nullptr);
  allocator.deallocate(p);
}

TEST(CachingAllocatorTest, EmptyCacheReturnsOnlyWhollyFreeSegments) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* a1 = allocator.allocate(CA::kSmallRequestMax);
  void* a2 = allocator.allocate(CA::kSmallRequestMax);  // segment A is full
  void* b1 = allocator.allocate(KiB);                   // segment B
  void* b2 = allocator.allocate(KiB);
  void* l1 = allocator.allocate(2 * MiB);  // segment L, large
  ASSERT_EQ(raw.alloc_calls, (std::vector<uint64_t>{2 * MiB, 2 * MiB, 16 * MiB}));
  allocator.deallocate(a1);
  allocator.deallocate(a2);  // A: wholly free
  allocator.deallocate(b1);  // B: partly free
  allocator.deallocate(l1);  // L: wholly free
  EXPECT_EQ(allocator.empty_cache(), 18 * MiB);
  EXPECT_EQ(raw.free_calls, (std::vector<uint64_t>{2 * MiB, 16 * MiB}));
  EXPECT_FIGURES(allocator, KiB, 4 * MiB + 2 * KiB, 2 * MiB, 20 * MiB);
  // B's free part still serves requests, from the cache.
  void* b3 = allocator.allocate(KiB);
  EXPECT_EQ(b3, b1);
  EXPECT_EQ(raw.alloc_calls.size(), 3u);
  EXPECT_EQ(allocator.empty_cache(), 0u);
  allocator.deallocate(b2);
  allocator.deallocate(b3);
  EXPECT_EQ(allocator.empty_cache(), 2 * MiB);
  EXPECT_EQ(raw.outstanding, 0u);
}

// Graph capture: a private pool's blocks never serve the shared pool, its freed blocks serve
// its own later allocations, the cache flushes leave it alone, and releasing it hands its
// memory to everyone.
TEST(CachingAllocatorTest, PrivatePoolKeepsItsMemoryUntilReleased) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* shared_free = allocator.allocate(KiB);
  allocator.deallocate(shared_free);  // a cached shared block the pool must not take
  allocator.begin_private_pool(7);
  void* g1 = allocator.allocate(KiB);
  void* g2 = allocator.allocate(KiB);
  EXPECT_NE(g1, shared_free);
  EXPECT_EQ(allocator.pool_of_pointer(g1), 7u);
  EXPECT_EQ(raw.alloc_calls, (std::vector<uint64_t>{2 * MiB, 2 * MiB}));  // a segment of its own
  allocator.deallocate(g1);
  void* g3 = allocator.allocate(KiB);  // inside the pool, a freed block is reused at once
  EXPECT_EQ(g3, g1);
  allocator.deallocate(g3);
  allocator.end_private_pool();
  // The shared pool gets its cached block back, and a new segment rather than the pool's
  // free block.
  void* s1 = allocator.allocate(KiB);
  EXPECT_EQ(s1, shared_free);
  EXPECT_EQ(allocator.pool_of_pointer(s1), 0u);
  void* s2 = allocator.allocate(KiB);
  EXPECT_NE(s2, g1);
  EXPECT_EQ(allocator.pool_of_pointer(s2), 0u);
  // A pool block freed after the capture returns to the pool, and flushing keeps the pool.
  allocator.deallocate(g2);
  allocator.deallocate(s1);
  allocator.deallocate(s2);
  EXPECT_EQ(allocator.empty_cache(), 2 * MiB);  // the shared segment only
  EXPECT_EQ(allocator.stats().reserved, 2 * MiB);
  // Resuming the pool finds its memory where it was.
  allocator.begin_private_pool(7);
  void* g4 = allocator.allocate(KiB);
  EXPECT_EQ(g4, g1);
  allocator.end_private_pool();
  // Released: its free blocks serve the shared pool, its live block returns there.
  allocator.release_private_pool(7);
  void* s3 = allocator.allocate(2 * KiB);
  EXPECT_EQ(at(s3), at(g1) + KiB);  // best fit in the former pool's segment
  EXPECT_EQ(allocator.pool_of_pointer(s3), 0u);
  EXPECT_EQ(allocator.pool_of_pointer(g4), 0u);
  allocator.deallocate(g4);
  allocator.deallocate(s3);
  EXPECT_EQ(allocator.empty_cache(), 2 * MiB);
  EXPECT_EQ(raw.outstanding, 0u);
}

// A block from before the capture, freed during it, may be what the graph reads: nobody gets
// it until the graph's pool is released.
TEST(CachingAllocatorTest, BlocksFreedDuringAPrivatePoolWaitForItsRelease) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* before = allocator.allocate(KiB);
  allocator.begin_private_pool(2);
  allocator.deallocate(before);
  std::string message;
  EXPECT_EQ(code_of([&] { allocator.deallocate(before); }, &message), Code::kInvalidArgument);
  allocator.end_private_pool();
  EXPECT_EQ(allocator.stats().allocated, KiB);  // still held
  void* after = allocator.allocate(KiB);
  EXPECT_NE(after, before);
  allocator.release_private_pool(2);
  EXPECT_EQ(allocator.stats().allocated, KiB);  // `after` only
  void* again = allocator.allocate(KiB);
  EXPECT_EQ(again, before);
  allocator.deallocate(after);
  allocator.deallocate(again);
  allocator.empty_cache();
  EXPECT_EQ(raw.outstanding, 0u);
}

TEST(CachingAllocatorTest, PrivatePoolMisuseAndOutOfMemory) {
  FakeRawMemory raw(4 * MiB);
  CA allocator(&raw, "cuda:0", 4 * MiB);
  std::string message;
  EXPECT_EQ(code_of([&] { allocator.begin_private_pool(0); }, &message), Code::kInvalidArgument);
  EXPECT_NE(message.find("id 0 is the shared pool"), std::string::npos) << message;
  // Two cached shared segments fill the fake; inside a pool they are not flushed, so the
  // pool's request fails at once and says why.
  void* a = allocator.allocate(KiB);
  void* b = allocator.allocate(2 * MiB);  // large: asks 16 MiB (refused), then flushes: 2 MiB
  allocator.deallocate(a);
  allocator.deallocate(b);
  const uint64_t flushes = allocator.stats().num_cache_flushes;
  allocator.begin_private_pool(3);
  EXPECT_EQ(code_of([&] { allocator.begin_private_pool(4); }, &message), Code::kFailedPrecondition);
  EXPECT_NE(message.find("while pool 3 is active"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { allocator.release_private_pool(3); }, &message),
            Code::kFailedPrecondition);
  EXPECT_EQ(code_of([&] { allocator.allocate(KiB); }, &message), Code::kResourceExhausted);
  std::printf("%s\n", message.c_str());
  EXPECT_NE(message.find("for private pool 3 (a graph capture"), std::string::npos) << message;
  EXPECT_EQ(allocator.stats().num_cache_flushes, flushes);
  EXPECT_TRUE(raw.free_calls.empty());  // the cached shared segments are still held
  allocator.end_private_pool();
  // Outside the pool the flush works as before.
  void* c = allocator.allocate(KiB);
  ASSERT_NE(c, nullptr);
  allocator.deallocate(c);
  allocator.release_private_pool(3);
  allocator.release_private_pool(99);  // unknown: nothing to do
  allocator.empty_cache();
  EXPECT_EQ(raw.outstanding, 0u);
}

TEST(CachingAllocatorTest, BadFreesAreReportedAndChangeNothing) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  void* a = allocator.allocate(4 * KiB);
  void* b = allocator.allocate(4 * KiB);
  allocator.deallocate(a);
  int on_stack = 0;
  std::string message;
  for (void* bad : {a, static_cast<void*>(&on_stack), static_cast<void*>(at(b) + 512)}) {
    EXPECT_EQ(code_of([&] { allocator.deallocate(bad); }, &message), Code::kInvalidArgument);
    EXPECT_NE(message.find("cuda:0: deallocate("), std::string::npos) << message;
    EXPECT_NE(message.find("not a live allocation"), std::string::npos) << message;
    EXPECT_NE(message.find("nothing was freed"), std::string::npos) << message;
  }
  EXPECT_FIGURES(allocator, 4 * KiB, 8 * KiB, 2 * MiB, 2 * MiB);
  EXPECT_EQ(allocator.block_size(b), 4 * KiB);
  // The block freed once is still a single free block: it serves the next request.
  EXPECT_EQ(allocator.allocate(4 * KiB), a);
  allocator.deallocate(a);
  allocator.deallocate(b);
}

// Random allocation and free sequences checked against a model: every live block lies in a
// segment, does not overlap another, keeps the bytes written to it, and the figures add up.
class RandomSequenceTest : public testing::TestWithParam<int> {};

TEST_P(RandomSequenceTest, LiveBlocksNeverOverlapAndKeepTheirContents) {
  const int seed = GetParam();
  std::mt19937_64 rng(seed);
  FakeRawMemory raw(~uint64_t{0}, /*misalign=*/seed % 2 == 1);
  CA allocator(&raw, "cuda:0", 0);
  struct Live {
    uint64_t bytes;
    unsigned char fill;
  };
  std::map<char*, Live> live;  // by address
  uint64_t allocs = 0;

  auto check_contents = [](char* p, const Live& block) {
    for (uint64_t i = 0; i < block.bytes; i += 61) {
      if (static_cast<unsigned char>(p[i]) != block.fill) return false;
    }
    return static_cast<unsigned char>(p[block.bytes - 1]) == block.fill;
  };

  for (int step = 0; step < 1500; ++step) {
    const uint64_t dice = rng() % 100;
    if (dice < 55 || live.empty()) {
      uint64_t bytes;
      const uint64_t kind = rng() % 10;
      if (kind < 6) {
        bytes = 1 + rng() % (16 * KiB);
      } else if (kind < 9) {
        bytes = 1 + rng() % CA::kSmallRequestMax;
      } else {
        bytes = CA::kSmallRequestMax + 1 + rng() % (8 * MiB);
      }
      char* p = at(allocator.allocate(bytes));
      ++allocs;
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % CA::kMinAlignment, 0u);
      const uint64_t block = allocator.block_size(p);
      ASSERT_GE(block, bytes);
      ASSERT_TRUE(raw.inside_a_segment(p, block)) << "step " << step;
      // No overlap with the live neighbours on either side.
      auto next = live.lower_bound(p);
      if (next != live.end()) {
        ASSERT_LE(p + block, next->first) << "step " << step;
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + allocator.block_size(prev->first), p) << "step " << step;
      }
      const Live entry{bytes, static_cast<unsigned char>(rng())};
      memset(p, entry.fill, bytes);
      live.emplace(p, entry);
    } else if (dice < 97) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(check_contents(it->first, it->second)) << "step " << step;
      allocator.deallocate(it->first);
      live.erase(it);
    } else {
      allocator.empty_cache();
    }

    const DeviceMemoryStats s = allocator.stats();
    uint64_t allocated = 0;
    for (auto& [p, entry] : live) allocated += allocator.block_size(p);
    ASSERT_EQ(s.allocated, allocated) << "step " << step;
    ASSERT_EQ(s.reserved, raw.outstanding) << "step " << step;
    ASSERT_GE(s.reserved, s.allocated);
    ASSERT_EQ(s.num_allocs, allocs);
    ASSERT_EQ(s.num_driver_allocs, raw.alloc_calls.size());
  }
  for (auto& [p, entry] : live) {
    EXPECT_TRUE(check_contents(p, entry));
    allocator.deallocate(p);
  }
  allocator.empty_cache();
  EXPECT_FIGURES(allocator, 0, allocator.stats().peak_allocated, 0,
                 allocator.stats().peak_reserved);
  EXPECT_EQ(raw.outstanding, 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomSequenceTest, testing::Values(1, 2, 3, 4));

TEST(CachingAllocatorTest, ThreadsShareOneAllocatorSafely) {
  FakeRawMemory raw;
  CA allocator(&raw, "cuda:0", 0);
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread keeps up to 8 blocks filled with its own byte; a block handed to two
      // threads at once would show the other thread's byte when checked before its free.
      std::mt19937 rng(t);
      std::vector<std::pair<char*, size_t>> held;
      auto release = [&](size_t k) {
        auto [p, bytes] = held[k];
        for (size_t i = 0; i < bytes; i += 97) failures[t] += p[i] != t + 1;
        failures[t] += p[bytes - 1] != t + 1;
        allocator.deallocate(p);
        held.erase(held.begin() + k);
      };
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = 1 + rng() % (64 * KiB);
        char* p = at(allocator.allocate(bytes));
        memset(p, t + 1, bytes);
        held.emplace_back(p, bytes);
        if (held.size() > 8) release(rng() % held.size());
      }
      while (!held.empty()) release(held.size() - 1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
  const DeviceMemoryStats s = allocator.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.num_allocs, 8000u);
  EXPECT_EQ(allocator.empty_cache(), s.reserved);
  EXPECT_EQ(raw.outstanding, 0u);
}

}  // namespace
}  // namespace loom::kernels::cuda
