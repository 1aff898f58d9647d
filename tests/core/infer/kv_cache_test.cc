// The KV cache on its own: appended rows come back in order for every sequence of a batch
// (B == 1: the buffer itself; B > 1: a contiguous gather), owners have separate slots,
// memory comes from the host's allocator, and a full cache fails naming its capacity.
#include "core/runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/plugin/host.h"
#include "loom/cpp/tensor.h"

namespace loom {
namespace {

constexpr int64_t kG = 2, kD = 3;

// Value of (sequence b, position s, group g, channel d) for key (v = 0) or value (v = 1).
float value_at(int64_t b, int64_t s, int64_t g, int64_t d, int v) {
  return static_cast<float>(v * 100000 + b * 10000 + s * 100 + g * 10 + d);
}

// (B, T, G, D) rows of positions first .. first + T - 1.
std::vector<float> rows(int64_t b, int64_t first, int64_t t, int v) {
  std::vector<float> out;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t s = first; s < first + t; ++s)
      for (int64_t g = 0; g < kG; ++g)
        for (int64_t d = 0; d < kD; ++d) out.push_back(value_at(i, s, g, d, v));
  return out;
}

void expect_all(const TensorView& view, int64_t b, int64_t total, int v) {
  ASSERT_EQ(view.ndim, 4);
  EXPECT_EQ(view.shape[0], b);
  EXPECT_EQ(view.shape[1], total);
  EXPECT_EQ(view.shape[2], kG);
  EXPECT_EQ(view.shape[3], kD);
  EXPECT_TRUE(is_contiguous(view));
  std::vector<float> want = rows(b, 0, total, v);
  const auto* got = static_cast<const float*>(view.data);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

TEST(KvCache, AppendsInOrderForEveryBatchSize) {
  for (int64_t b : {1, 3}) {
    SCOPED_TRACE("B = " + std::to_string(b));
    core::Host host(nullptr, 0);
    uint64_t before = host.cpu_memory().current;
    {
      core::KvCache cache(host, b, 8);
      int layer0 = 0, layer1 = 0;  // two owners
      int64_t pos = 0;
      for (int64_t t : {3, 1, 2, 1}) {
        for (const void* owner :
             {static_cast<const void*>(&layer0), static_cast<const void*>(&layer1)}) {
          std::vector<float> k = rows(b, pos, t, 0), v = rows(b, pos, t, 1);
          TensorView kv = make_view(k.data(), DType::kF32, {b, t, kG, kD});
          TensorView vv = make_view(v.data(), DType::kF32, {b, t, kG, kD});
          TensorView k_all{}, v_all{};
          throw_if_error(cache.append(owner, &kv, &vv, &k_all, &v_all));
          expect_all(k_all, b, pos + t, 0);
          expect_all(v_all, b, pos + t, 1);
        }
        cache.advance(t);
        pos += t;
        EXPECT_EQ(cache.past_length(), pos);
      }
      // Two owners, keys and values, (B, 8, G, D) f32 each; B > 1 adds a gather scratch.
      uint64_t expected = 2 * 2 * static_cast<uint64_t>(b * 8 * kG * kD) * 4 * (b > 1 ? 2 : 1);
      EXPECT_EQ(cache.bytes(), expected);
      EXPECT_GE(host.cpu_memory().current - before, expected);
      cache.reset();
      EXPECT_EQ(cache.past_length(), 0);
    }
    EXPECT_EQ(host.cpu_memory().current, before);  // freed with the cache
  }
}

TEST(KvCache, FullCacheNamesItsCapacity) {
  core::Host host(nullptr, 0);
  core::KvCache cache(host, 1, 4);
  int owner = 0;
  std::vector<float> k = rows(1, 0, 3, 0), v = rows(1, 0, 3, 1);
  TensorView kv = make_view(k.data(), DType::kF32, {1, 3, kG, kD});
  TensorView vv = make_view(v.data(), DType::kF32, {1, 3, kG, kD});
  TensorView k_all{}, v_all{};
  throw_if_error(cache.append(&owner, &kv, &vv, &k_all, &v_all));
  cache.advance(3);
  Status s = cache.append(&owner, &kv, &vv, &k_all, &v_all);  // 3 + 3 > 4
  ASSERT_EQ(s.code, Code::kOutOfRange);
  std::string message = take_message(&s);
  EXPECT_NE(message.find("capacity of 4"), std::string::npos) << message;
  EXPECT_THROW(cache.advance(2), Error);
  // A batch that differs from the cache's, or an owner that changes its shape, is refused.
  TensorView k2 = make_view(k.data(), DType::kF32, {3, 1, kG, kD});
  s = cache.append(&owner, &k2, &k2, &k_all, &v_all);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  status_release(&s);
  TensorView k3 = make_view(k.data(), DType::kF32, {1, 1, kD, kG});
  s = cache.append(&owner, &k3, &k3, &k_all, &v_all);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  status_release(&s);
  EXPECT_THROW(core::KvCache(host, 0, 4), Error);
  // A cache on a device takes tensors on that device only.
  core::KvCache on_device(host, 1, 4, Device{DeviceType::kCuda, 0});
  s = on_device.append(&owner, &kv, &vv, &k_all, &v_all);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  message = take_message(&s);
  EXPECT_NE(message.find("on the cache's device (cuda)"), std::string::npos) << message;
}

// Values may be narrower or wider than keys (a multi-latent attention layer caches its two
// latents as k and v): both come back in order, each with its own width; a v whose B, T or
// G differs from k's is refused.
TEST(KvCache, ValuesMayHaveTheirOwnWidth) {
  core::Host host(nullptr, 0);
  core::KvCache cache(host, 2, 6);
  int owner = 0;
  std::vector<float> k(2 * 3 * 1 * 4), v(2 * 3 * 1 * 2);
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1000.f + static_cast<float>(i);
  TensorView kv = make_view(k.data(), DType::kF32, {2, 3, 1, 4});
  TensorView vv = make_view(v.data(), DType::kF32, {2, 3, 1, 2});
  TensorView k_all{}, v_all{};
  throw_if_error(cache.append(&owner, &kv, &vv, &k_all, &v_all));
  cache.advance(3);
  throw_if_error(cache.append(&owner, &kv, &vv, &k_all, &v_all));  // 3 more positions
  ASSERT_EQ(k_all.shape[1], 6);
  EXPECT_EQ(k_all.shape[3], 4);
  EXPECT_EQ(v_all.shape[3], 2);
  const auto* ka = static_cast<const float*>(k_all.data);
  const auto* va = static_cast<const float*>(v_all.data);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 6; ++s) {
      for (int64_t d = 0; d < 4; ++d)
        ASSERT_EQ(ka[(b * 6 + s) * 4 + d], k[(b * 3 + s % 3) * 4 + d]) << b << " " << s;
      for (int64_t d = 0; d < 2; ++d)
        ASSERT_EQ(va[(b * 6 + s) * 2 + d], v[(b * 3 + s % 3) * 2 + d]) << b << " " << s;
    }
  TensorView short_v = make_view(v.data(), DType::kF32, {2, 1, 1, 2});
  Status st = cache.append(&owner, &kv, &short_v, &k_all, &v_all);
  EXPECT_EQ(st.code, Code::kInvalidArgument);
  status_release(&st);
}

// A layer's fixed-shape decoding state (IKvCache::state): zeros when made, the same memory
// and contents on every later call (whatever past_length is), one tensor per (owner, slot),
// counted in bytes(); a shape without the cache's batch first, or an owner that changes its
// state's shape or dtype, is refused naming the slot.
TEST(KvCache, StatesPersistPerOwnerAndSlot) {
  core::Host host(nullptr, 0);
  core::KvCache cache(host, 2, 8);
  int a = 0, b = 0;
  TensorView s0{}, s1{}, again{}, other{};
  const int64_t shape[3] = {2, 3, 4};
  throw_if_error(cache.state(&a, 0, DType::kF32, 3, shape, &s0));
  throw_if_error(cache.state(&a, 1, DType::kF32, 3, shape, &s1));
  throw_if_error(cache.state(&b, 0, DType::kF32, 3, shape, &other));
  EXPECT_NE(s0.data, s1.data);
  EXPECT_NE(s0.data, other.data);
  EXPECT_TRUE(is_contiguous(s0));
  EXPECT_EQ(s0.shape[0], 2);
  EXPECT_EQ(s0.shape[2], 4);
  auto* f = static_cast<float*>(s0.data);
  for (int i = 0; i < 24; ++i) ASSERT_EQ(f[i], 0.f) << i;
  for (int i = 0; i < 24; ++i) f[i] = static_cast<float>(i);
  cache.advance(5);
  throw_if_error(cache.state(&a, 0, DType::kF32, 3, shape, &again));
  EXPECT_EQ(again.data, s0.data);
  EXPECT_EQ(static_cast<float*>(again.data)[23], 23.f);
  EXPECT_EQ(cache.bytes(), 3u * 24u * sizeof(float));
  const int64_t wrong_batch[2] = {1, 4};
  Status st = cache.state(&a, 2, DType::kF32, 2, wrong_batch, &again);
  ASSERT_EQ(st.code, Code::kInvalidArgument);
  std::string message = take_message(&st);
  EXPECT_NE(message.find("B = 2"), std::string::npos) << message;
  st = cache.state(&a, 0, DType::kBF16, 3, shape, &again);
  ASSERT_EQ(st.code, Code::kInvalidArgument);
  message = take_message(&st);
  EXPECT_NE(message.find("slot 0"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom
