#include "kernels/cuda/runtime/caching_allocator.h"

#include <loom/cpp/error.h>
#include <stdio.h>

#include <algorithm>
#include <utility>

namespace loom::kernels::cuda {
namespace {

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// "3.00 MiB (3145728 bytes)": the unit for reading, the exact count for checking.
std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  char text[64];
  if (bytes < 1024) {
    snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
    return text;
  }
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit + 1 < 5) {
    value /= 1024;
    ++unit;
  }
  snprintf(text, sizeof text, "%.2f %s (%llu bytes)", value, kUnits[unit],
           static_cast<unsigned long long>(bytes));
  return text;
}

}  // namespace

CachingAllocator::CachingAllocator(RawMemory* raw, std::string name, uint64_t total)
    : raw_(raw), name_(std::move(name)) {
  stats_.total = total;
}

CachingAllocator::~CachingAllocator() {
  for (auto& [base, segment] : segments_) {
    for (Block* block = segment->first; block != nullptr;) {
      Block* next = block->next;
      delete block;
      block = next;
    }
    raw_->free(segment->base);
    delete segment;
  }
}

uint64_t CachingAllocator::segment_size(uint64_t size, bool small) {
  if (small) return kSmallSegment;
  return std::max(round_up(size, kLargeSegmentStep), kLargeSegmentMin);
}

void* CachingAllocator::allocate(uint64_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > kMaxRequest) fail_out_of_memory(bytes, 0, 0);
  const uint64_t size = round_up(bytes, kGranule);
  const bool small = size <= kSmallRequestMax;

  Block* block = take_from_cache(size, small);
  if (block == nullptr) {
    block = new_segment(segment_size(size, small), small);
    if (block == nullptr && active_pool_ != 0) {
      // No flush inside a private pool: a driver free would break the capture it serves.
      const uint64_t segment = small ? kSmallSegment : round_up(size, kLargeSegmentStep);
      block = new_segment(segment, small);
      if (block == nullptr) fail_out_of_memory(bytes, segment, 0);
    }
    if (block == nullptr) {
      // The driver may be short only because our cache holds it: give back every wholly
      // free segment and ask once more, for no more than the request needs (a large request
      // asked for at least kLargeSegmentMin the first time).
      ++stats_.num_cache_flushes;
      const uint64_t released = release_free_segments();
      const uint64_t segment = small ? kSmallSegment : round_up(size, kLargeSegmentStep);
      block = new_segment(segment, small);
      if (block == nullptr) fail_out_of_memory(bytes, segment, released);
    }
    split(block, size);
  }

  block->live = true;
  live_.emplace(block->address, block);
  stats_.allocated += block->size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.num_allocs;
  return block->address;
}

CachingAllocator::Block* CachingAllocator::take_from_cache(uint64_t size, bool small) {
  FreeSet& pool = free_set(active_pool_, small);
  // A null address sorts first among equal sizes: the lowest-addressed best fit.
  Block key{nullptr, size, false, nullptr, nullptr, nullptr};
  auto it = pool.lower_bound(&key);
  if (it == pool.end()) return nullptr;
  Block* block = *it;
  pool.erase(it);
  split(block, size);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(uint64_t size, bool small) {
  void* memory = raw_->alloc(size);
  if (memory == nullptr) return nullptr;
  if (reinterpret_cast<uintptr_t>(memory) % kMinAlignment != 0) {
    raw_->free(memory);
    fail(Code::kInternal, detail::concat(name_, ": the raw allocator returned ", memory,
                                         ", not aligned to ", kMinAlignment, " bytes"));
  }
  auto* segment = new Segment{static_cast<char*>(memory), size, small, nullptr, active_pool_};
  auto* block = new Block{segment->base, size, false, nullptr, nullptr, segment};
  segment->first = block;
  segments_.emplace(segment->base, segment);
  stats_.reserved += size;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  ++stats_.num_driver_allocs;
  return block;
}

// Cuts `block` (not in any free set) down to `size` when the rest is worth keeping as a
// free block of its pool. The rest cannot have a free right neighbour: `block` was free, and
// free blocks never touch (deallocate merges them).
void CachingAllocator::split(Block* block, uint64_t size) {
  const uint64_t rest_size = block->size - size;
  const bool small = block->segment->small;
  if (small ? rest_size < kGranule : rest_size <= kSmallRequestMax) return;
  FreeSet& pool = free_set_of(block);
  auto* rest =
      new Block{block->address + size, rest_size, false, block, block->next, block->segment};
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool.insert(rest);
}

void CachingAllocator::deallocate(void* pointer) {
  if (pointer == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(pointer);
  if (it == live_.end()) {
    fail(Code::kInvalidArgument,
         detail::concat(name_, ": deallocate(", pointer,
                        "): not a live allocation of this device (never allocated here, freed "
                        "twice, or not the start of an allocation); nothing was freed"));
  }
  Block* block = it->second;
  if (active_pool_ != 0 && block->segment->pool != active_pool_) {
    // Allocated before the capture (or by another graph's): the captured work may use it.
    live_.erase(it);  // a second free is reported as one
    deferred_[active_pool_].push_back(block);
    return;
  }
  free_block(block);
}

void CachingAllocator::free_block(Block* block) {
  live_.erase(block->address);
  stats_.allocated -= block->size;
  block->live = false;

  // Merge with free neighbours; a set orders by size, so erase before resizing.
  FreeSet& pool = free_set_of(block);
  if (Block* next = block->next; next != nullptr && !next->live) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  if (Block* prev = block->prev; prev != nullptr && !prev->live) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  pool.insert(block);
}

uint64_t CachingAllocator::release_free_segments() {
  uint64_t released = 0;
  // Only the shared pool: a private pool's memory belongs to its graph.
  FreeSets& shared = free_[0];
  for (FreeSet* pool : {&shared.small, &shared.large}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {  // part of a segment in use
        ++it;
        continue;
      }
      it = pool->erase(it);
      Segment* segment = block->segment;
      segments_.erase(segment->base);
      raw_->free(segment->base);
      stats_.reserved -= segment->size;
      released += segment->size;
      delete block;
      delete segment;
    }
  }
  return released;
}

uint64_t CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  return release_free_segments();
}

DeviceMemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

uint64_t CachingAllocator::block_size(const void* pointer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(pointer);
  return it == live_.end() ? 0 : it->second->size;
}

void CachingAllocator::begin_private_pool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pool == 0)
    fail(Code::kInvalidArgument,
         detail::concat(name_, ": private pool id 0 is the shared pool; pick another id"));
  if (active_pool_ != 0)
    fail(Code::kFailedPrecondition,
         detail::concat(name_, ": private pool ", pool, " cannot begin while pool ", active_pool_,
                        " is active; end that one first"));
  active_pool_ = pool;
}

void CachingAllocator::end_private_pool() {
  std::lock_guard<std::mutex> lock(mutex_);
  active_pool_ = 0;
}

void CachingAllocator::release_private_pool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pool == 0) return;
  if (pool == active_pool_)
    fail(Code::kFailedPrecondition,
         detail::concat(name_, ": private pool ", pool, " is active; end it before releasing it"));
  auto it = free_.find(pool);
  FreeSets& shared = free_[0];
  if (it != free_.end()) {
    // Free blocks keep their size and address: only the set they sit in changes.
    for (Block* block : it->second.small) shared.small.insert(block);
    for (Block* block : it->second.large) shared.large.insert(block);
    free_.erase(it);
  }
  for (auto& [base, segment] : segments_)
    if (segment->pool == pool) segment->pool = 0;
  if (auto d = deferred_.find(pool); d != deferred_.end()) {
    std::vector<Block*> blocks = std::move(d->second);
    deferred_.erase(d);
    for (Block* block : blocks) free_block(block);
  }
}

uint64_t CachingAllocator::pool_of_pointer(const void* pointer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(pointer);
  return it == live_.end() ? 0 : it->second->segment->pool;
}

void CachingAllocator::fail_out_of_memory(uint64_t requested, uint64_t segment,
                                          uint64_t released) const {
  std::string message = name_ + ": out of memory: cannot allocate " + format_bytes(requested);
  if (segment == 0) {
    message += ", more than any device has";
  } else if (active_pool_ != 0) {
    message += " (as a new segment of " + format_bytes(segment) + ") for private pool " +
               std::to_string(active_pool_) +
               " (a graph capture, which cannot return cached segments to the driver)";
  } else {
    message += " (as a new segment of " + format_bytes(segment) + "), even after returning " +
               format_bytes(released) + " of cached free segments to the driver";
  }
  message += "; allocated " + format_bytes(stats_.allocated) + ", reserved " +
             format_bytes(stats_.reserved) + ", device total " +
             (stats_.total != 0 ? format_bytes(stats_.total) : std::string("unknown")) +
             ". Lower the micro-batch size or sequence length, turn on activation "
             "recomputation or the distributed optimizer, or use more devices (tensor or "
             "pipeline parallelism)";
  fail(Code::kResourceExhausted, message);
}

}  // namespace loom::kernels::cuda
