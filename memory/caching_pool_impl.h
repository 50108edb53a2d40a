// Internals of CachingPool shared by caching_pool.cpp and thread_cache.cpp. Not installed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <tandem/memory/caching_pool.h>

#include "memory/node_arena.h"

namespace tandem::memory {

enum class PoolKind : std::uint8_t { kSmall, kLarge, kAligned };

struct Segment;

// A contiguous piece of a segment, allocated or free. Protected by the pool mutex.
struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  StreamId stream;
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  bool allocated = false;
};

// Memory obtained from the upstream in one allocate() call.
struct Segment {
  char* base = nullptr;
  std::size_t size = 0;
  std::size_t alignment = 0;
  StreamId stream;
  PoolKind kind = PoolKind::kSmall;
  Block* first = nullptr;
};

// Free-set order: stream, then size, then address (best fit = lower_bound).
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

// Test-and-test-and-set lock: one atomic exchange when uncontended, which is the common case
// (only stats/snapshot/flush ever touch another thread's cache).
class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

// One thread's private cache of freed small blocks for one pool. Guarded by `lock`; owned
// jointly by the thread (thread_local list) and the pool (registry).
struct ThreadCache {
  SpinLock lock;
  std::atomic<CachingPool::Impl*> owner{nullptr};  // null once the pool or the thread is gone
  std::vector<void*> slots;         // bins x capacity
  std::vector<std::uint32_t> counts;  // per bin
  std::int64_t held_bytes = 0, held_blocks = 0;
  std::int64_t pop_bytes = 0, pop_count = 0, push_bytes = 0, push_count = 0;
};

// Counters of a thread cache, summed.
struct CacheCounters {
  std::int64_t held_bytes = 0, held_blocks = 0;
  std::int64_t pop_bytes = 0, pop_count = 0, push_bytes = 0, push_count = 0;
  void add(const ThreadCache& c) {
    held_bytes += c.held_bytes; held_blocks += c.held_blocks;
    pop_bytes += c.pop_bytes; pop_count += c.pop_count;
    push_bytes += c.push_bytes; push_count += c.push_count;
  }
};

struct CachingPool::Impl {
  Impl(MemoryResource& upstream, CachingPoolOptions options);

  void* allocate(std::size_t bytes, std::size_t alignment, StreamId stream);
  void deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept;
  std::size_t release();
  void fill_stats(MemoryStats& s) const;
  void fill_snapshot(Snapshot& s) const;
  void reset_peak();
  std::size_t round_size(std::size_t bytes) const;
  void destroy();

  // --- locked helpers (caller holds mu) ---
  Block* alloc_locked(std::size_t size, StreamId stream, std::string* upstream_error);
  Block* alloc_aligned_locked(std::size_t size, std::size_t alignment, StreamId stream,
                              std::string* upstream_error);
  std::size_t free_block_locked(Block* b);  // returns the block size
  std::size_t release_locked();
  std::string oom_message_locked(std::size_t bytes, std::size_t alignment, StreamId stream,
                                 const std::string& upstream_error) const;
  void fill_locked_stats(MemoryStats& s) const;

  // --- lock-free user-visible counters ---
  void note_alloc(std::int64_t size);
  void note_free(std::int64_t size);

  // --- thread caches (thread_cache.cpp) ---
  void* cache_pop(std::size_t size);
  bool cache_push(void* p, std::size_t size);
  void flush_thread_caches();                       // every cache's blocks back to the pool
  void return_cached(const std::vector<void*>& ps);  // takes mu
  void detach_thread_caches();
  CacheCounters sum_thread_caches(std::unordered_set<const void*>* cached) const;
  std::shared_ptr<ThreadCache> make_thread_cache();

  MemoryResource& upstream;
  CachingPoolOptions opt;
  std::uint64_t id;
  // Asked of the upstream for segments: opt.segment_alignment capped at upstream.max_alignment().
  std::size_t segment_alignment = 0;
  // Every cached block's alignment: blocks start at multiples of min_block_size in a segment.
  std::size_t block_alignment = 0;
  std::size_t cache_bins = 0;
  bool cache_enabled = false;

  mutable std::mutex mu;
  // Blocks and container nodes are recycled (declared first: destroyed after the containers).
  NodeArena arena;
  using FreeSet = std::set<Block*, BlockLess, ArenaAllocator<Block*>>;
  using LiveMap = std::unordered_map<void*, Block*, std::hash<void*>, std::equal_to<void*>,
                                     ArenaAllocator<std::pair<void* const, Block*>>>;
  FreeSet small_free{BlockLess{}, ArenaAllocator<Block*>(arena)};
  FreeSet large_free{BlockLess{}, ArenaAllocator<Block*>(arena)};
  // Allocated blocks, thread-cached ones included.
  LiveMap live{64, std::hash<void*>{}, std::equal_to<void*>{}, LiveMap::allocator_type(arena)};
  std::unordered_set<Segment*> segments;
  Stat reserved, segment_count, active, active_blocks, inactive_split, inactive_split_blocks;
  std::int64_t locked_alloc_bytes = 0, locked_alloc_count = 0;
  std::int64_t locked_freed_bytes = 0, locked_freed_count = 0;
  std::int64_t hits = 0, misses = 0, retries = 0, ooms = 0;
  CacheCounters retired;  // counters of thread caches whose thread exited

  std::atomic<std::int64_t> alloc_bytes{0}, alloc_bytes_peak{0};
  std::atomic<std::int64_t> alloc_count{0}, alloc_count_peak{0};

  mutable std::mutex caches_mu;
  std::vector<std::shared_ptr<ThreadCache>> caches;
};

// Throws ConfigError naming the pool and the option when `o` is inconsistent
// (caching_pool_options.cpp).
void validate_pool_options(const CachingPoolOptions& o);

// The alignment to ask `upstream` for segments: o.segment_alignment capped at what the upstream
// honours. Throws ConfigError when the upstream reports an alignment that is not a power of two.
std::size_t negotiate_segment_alignment(const CachingPoolOptions& o, const MemoryResource& upstream);

// Adds `delta` to a locked Stat (total/freed/peak follow).
inline void stat_add(Stat& s, std::int64_t delta) {
  s.current += delta;
  if (delta > 0) {
    s.total += delta;
    if (s.current > s.peak) s.peak = s.current;
  } else {
    s.freed -= delta;
  }
}

}  // namespace tandem::memory
