// KvCache: the core's IKvCache (loom/kinds/module.h), the keys and values of earlier
// positions during incremental decoding (`loom generate`, core/infer/generator.h).
//
// Each attention layer (an `owner`) gets its own slot, allocated on its first `append`
// from the host's allocator (so the memory is counted): keys and values of capacity
// (B, capacity, G, D) in the layer's dtype. `append` writes the new (B, T, G, D) rows at
// positions past_length() .. past_length() + T - 1 and returns views of every position so
// far, (B, past + T, G, D), contiguous: for B == 1 the buffer's prefix itself; for B > 1 the
// sequences are copied into a contiguous scratch of the slot (the buffer keeps each
// sequence's capacity rows together, so its prefix is not contiguous across sequences).
// After each whole forward pass of the model the owner of the cache calls `advance(T)`.
//
// Layers that are not attention (a Mamba mixer) keep a fixed-shape state per (owner, slot)
// instead (`state`), which they read and overwrite themselves.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/host.h"
#include "loom/kinds/module.h"

namespace loom::core {

class KvCache final : public IKvCache {
 public:
  /// \param host      allocator of the buffers; must outlive the cache
  /// \param batch     B, the sequences decoded together (>= 1)
  /// \param capacity  the longest sequence (positions) it holds (>= 1)
  /// \param device    where the buffers live (the CPU or a device; appends copy through
  ///                  IHost::copy on that device)
  /// Throws Error(kInvalidArgument) for batch or capacity < 1.
  KvCache(IHost& host, int64_t batch, int64_t capacity,
          Device device = Device{DeviceType::kCpu, 0});
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t past_length() const noexcept override { return past_; }
  /// See IKvCache::append. Besides a full cache (kOutOfRange), fails with kInvalidArgument
  /// when k or v is not a contiguous (B, T, G, D) tensor of this cache's B and device, when
  /// they differ in B, T, G or dtype (v's D may differ from k's), or when an owner changes
  /// its dtype, G or either D between calls.
  Status append(const void* owner, const TensorView* k, const TensorView* v, TensorView* k_all,
                TensorView* v_all) noexcept override;
  /// See IKvCache::state: allocated from the host on first use (counted in bytes()),
  /// zero-filled then; kept (with its contents) until the cache is destroyed.
  Status state(const void* owner, int32_t slot, DType dtype, int32_t ndim, const int64_t* shape,
               TensorView* out) noexcept override;

  /// Marks `t` more positions as cached: call once after each whole forward pass of the
  /// model that appended `t` new tokens per sequence. Throws Error(kOutOfRange) when past +
  /// t exceeds the capacity, kInvalidArgument for t < 0.
  void advance(int64_t t);
  /// Forgets every position (a new sequence); the buffers are kept for reuse.
  void reset() { past_ = 0; }

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  /// Bytes allocated for buffers and scratch so far.
  uint64_t bytes() const { return bytes_; }

 private:
  struct Slot {
    DType dtype = DType::kF32;
    int64_t groups = 0, head_dim = 0, v_dim = 0;
    void* k = nullptr;  // (B, capacity, G, D)
    void* v = nullptr;
    void* k_scratch = nullptr;  // (B, capacity, G, D) when B > 1: contiguous (B, S, G, D)
    void* v_scratch = nullptr;
  };
  void* allocate(uint64_t bytes);
  /// Copies `bytes` within the cache's device.
  void copy(void* to, const void* from, size_t bytes);
  Slot& slot_for(const void* owner, const TensorView& k, const TensorView& v);

  IHost& host_;
  int64_t batch_, capacity_;
  Device device_;
  int64_t past_ = 0;
  std::unordered_map<const void*, Slot> slots_;
  struct State {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    void* data = nullptr;
  };
  std::map<std::pair<const void*, int32_t>, State> states_;
  uint64_t bytes_ = 0;
};

}  // namespace loom::core
