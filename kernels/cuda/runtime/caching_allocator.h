// CachingAllocator: a device memory cache over a raw allocator (cudaMalloc / cudaFree on a
// GPU, a fake in tests), so that training steps, which free and allocate the same sizes over
// and over, stop paying for the driver's allocator (cudaMalloc synchronises the device and
// takes milliseconds; a cache hit takes well under a microsecond).
//
// Plain C++ with no CUDA types: the whole policy is tested on the CPU against a fake.
//
// Design.
//   - Memory comes from the raw allocator in *segments*; a segment is cut into *blocks*, a
//     doubly linked list of address-adjacent pieces, each either live (handed out) or free.
//   - Every block size is a multiple of kGranule (512 B) and every block starts at a multiple
//     of kGranule from its segment's base, so a block is aligned at least as well as the
//     segments are (the raw allocator guarantees kMinAlignment, 256 B; cudaMalloc gives more).
//   - Two pools that never share segments, so small tensors do not fragment the segments that
//     big ones need:
//       small: requests up to kSmallRequestMax (1 MiB), from kSmallSegment (2 MiB) segments;
//              a block is split when the remainder is at least one granule;
//       large: bigger requests, from segments of the request rounded up to kLargeSegmentStep
//              (2 MiB) and at least kLargeSegmentMin (16 MiB), so a run of mid-size
//              requests shares one segment; a block is split only when the remainder could
//              serve another large request (more than kSmallRequestMax), otherwise the
//              remainder stays inside the block (and counts as allocated).
//   - A request takes the smallest free block of its pool that fits (best fit; on equal
//     sizes, the lowest address). On free, a block merges with its free neighbours of the
//     same segment, so freed neighbours serve a request as big as their sum.
//   - empty_cache() returns segments that are wholly free to the raw allocator. When the raw
//     allocator fails, the allocator does exactly that and tries once more, asking this time
//     for the smallest segment that holds the request (the request rounded up to 2 MiB, not
//     kLargeSegmentMin); if that fails too it throws loom::Error(kResourceExhausted) giving
//     the request and the figures.
//
// Single-stream semantics. A freed block may be handed out again by the very next
// allocation, with no event or synchronisation: this is correct because all device work
// that uses this memory is ordered on one compute stream (loom/device.h), so whatever the
// next owner enqueues runs after whatever the previous owner enqueued. Work on another
// stream (a communicator's) must be ordered against the compute stream by whoever issues it,
// before the memory it touches is freed.
//
// Private pools (graph capture). While a private pool is active (begin_private_pool), every
// allocation is served from segments of that pool alone, and blocks freed into it are reused
// only by later allocations of the same pool. A CUDA graph captured meanwhile keeps using the
// addresses it saw on every replay, so no other allocation may take them: the pool's memory,
// free or live, stays the graph's until release_private_pool hands its segments to the shared
// pool (the graph is gone). empty_cache and the out-of-memory flush never touch a private
// pool, and while one is active the flush does not run at all (a driver free inside a
// capture would break it): an allocation the driver cannot serve then fails at once. A block
// of another pool freed while a private pool is active may still be used by the graph being
// captured: it stays live until that private pool is released.
//
// Thread-safe: every public method takes one mutex (the raw allocator is called under it).
#pragma once

#include <stdint.h>

#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/device.h"

namespace loom::kernels::cuda {

/// The driver's allocator, as the cache sees it.
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  /// Returns `bytes` of fresh memory aligned to at least CachingAllocator::kMinAlignment, or
  /// null when the device is out of memory. May throw loom::Error for any other failure (a
  /// broken device context); the cache is then unchanged.
  virtual void* alloc(uint64_t bytes) = 0;
  /// Returns memory obtained from alloc. Must not throw (report failures by other means).
  virtual void free(void* pointer) noexcept = 0;
};

class CachingAllocator {
 public:
  static constexpr uint64_t kGranule = 512;               ///< block sizes are multiples
  static constexpr uint64_t kMinAlignment = 256;          ///< of every pointer handed out
  static constexpr uint64_t kSmallRequestMax = 1 << 20;   ///< largest small-pool request
  static constexpr uint64_t kSmallSegment = 2 << 20;      ///< size of small-pool segments
  static constexpr uint64_t kLargeSegmentStep = 2 << 20;  ///< large segments are multiples
  static constexpr uint64_t kLargeSegmentMin = 16 << 20;  ///< smallest large segment
  /// Requests above this (2^56 B) fail at once: no device has it, and rounding would wrap.
  static constexpr uint64_t kMaxRequest = uint64_t{1} << 56;

  /// \param raw    the driver's allocator; must outlive this object
  /// \param name   the device, for messages ("cuda:0")
  /// \param total  the device's capacity in bytes, for messages and stats (0 when unknown)
  CachingAllocator(RawMemory* raw, std::string name, uint64_t total);
  /// Returns every segment to the raw allocator, live blocks included (their owners must be
  /// gone: destroy the allocator only after the memory's last user).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// Hands out `bytes` (rounded up to kGranule), aligned to at least kMinAlignment; 0 gives
  /// null. Throws loom::Error(kResourceExhausted) when the device cannot supply it even after
  /// the cache was emptied, with the requested size, allocated, reserved and device total.
  void* allocate(uint64_t bytes);

  /// Takes back a pointer from allocate; null is a no-op. Throws loom::Error(kInvalidArgument)
  /// for a pointer that is not live here (never handed out, freed twice, or pointing inside a
  /// block), changing nothing.
  void deallocate(void* pointer);

  /// Returns the wholly free segments to the raw allocator; returns the bytes released.
  uint64_t empty_cache();

  /// Current figures. `allocated` counts whole live blocks: each request rounded up to
  /// kGranule, plus the unsplit remainder a large block may carry; `reserved` counts the
  /// segments held; `total` is the capacity given at construction.
  DeviceMemoryStats stats() const;

  /// Sets the peaks to the current figures.
  void reset_peak();

  /// The size of the block serving live pointer `pointer` (>= the request), 0 when the
  /// pointer is not live. For tests and diagnostics.
  uint64_t block_size(const void* pointer) const;

  /// Serves every allocation from private pool `pool` (any id but 0, the shared pool) until
  /// end_private_pool. A pool may be resumed later with the same id. Throws
  /// loom::Error(kFailedPrecondition) when a private pool is already active, or
  /// kInvalidArgument for id 0.
  void begin_private_pool(uint64_t pool);

  /// Goes back to the shared pool for new allocations (the private pool keeps its memory).
  /// A no-op when no private pool is active.
  void end_private_pool();

  /// Hands every segment of private pool `pool` to the shared pool: its free blocks serve any
  /// allocation from now on, its live blocks return there when freed, and the blocks of other
  /// pools freed while it was active are freed now. Call it once nothing
  /// uses the pool's addresses any more (its graph was destroyed). Throws
  /// loom::Error(kFailedPrecondition) while that pool is active; an unknown id is a no-op.
  void release_private_pool(uint64_t pool);

  /// The private pool of live pointer `pointer`, 0 for the shared pool or a pointer that is
  /// not live. For tests and diagnostics.
  uint64_t pool_of_pointer(const void* pointer) const;

 private:
  struct Segment;
  struct Block {
    char* address;
    uint64_t size;
    bool live;
    Block* prev;  // address-adjacent neighbours within the segment (null at the ends)
    Block* next;
    Segment* segment;
  };
  struct Segment {
    char* base;
    uint64_t size;
    bool small;
    Block* first;   // the block at `base`; never merged away, so it stays valid
    uint64_t pool;  // 0: the shared pool; else the private pool that owns it
  };
  // Free blocks ordered by (size, address): lower_bound({size}) is the best fit.
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->address < b->address;
    }
  };
  using FreeSet = std::set<Block*, BySizeThenAddress>;

  struct FreeSets {
    FreeSet small, large;
  };
  // The free blocks of a segment's pool, by its size class.
  FreeSet& free_set(uint64_t pool, bool small) {
    FreeSets& sets = free_[pool];
    return small ? sets.small : sets.large;
  }
  FreeSet& free_set_of(const Block* block) {
    return free_set(block->segment->pool, block->segment->small);
  }
  Block* take_from_cache(uint64_t size, bool small);
  static uint64_t segment_size(uint64_t size, bool small);
  Block* new_segment(uint64_t size, bool small);
  void split(Block* block, uint64_t size);
  uint64_t release_free_segments();
  void free_block(Block* block);
  [[noreturn]] void fail_out_of_memory(uint64_t requested, uint64_t segment,
                                       uint64_t released) const;

  RawMemory* raw_;
  const std::string name_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, FreeSets> free_;  // by pool; 0 is the shared pool
  uint64_t active_pool_ = 0;                     // where new allocations come from
  // Blocks of other pools freed while a private pool was active, by that pool: kept live
  // until it is released (its graph may use them).
  std::unordered_map<uint64_t, std::vector<Block*>> deferred_;
  std::unordered_map<const void*, Block*> live_;        // by address
  std::unordered_map<const void*, Segment*> segments_;  // by base, every segment held
  DeviceMemoryStats stats_{};
};

}  // namespace loom::kernels::cuda
