// CachingPool: a caching allocator over any upstream resource (host memory, cudaMalloc, ...).
//
// Policy (PyTorch's CUDA caching allocator, made backend-independent):
//  - requests are rounded up to min_block_size (optionally to power-of-two divisions);
//  - requests <= small_size come from the small pool, carved out of small_segment_size segments;
//    larger ones from the large pool (large_segment_size segments below large_segment_threshold,
//    otherwise a segment of exactly the rounded size, itself rounded to segment_rounding);
//  - best fit: the smallest free block of the same pool and stream that fits, split when the
//    remainder is worth keeping; freed blocks merge with free neighbours of their segment;
//  - blocks larger than max_split_size are never split, and are reused only by requests of at
//    least max_split_size (limits fragmentation from huge blocks);
//  - when the upstream fails, cached memory is released and the request retried once; then
//    tandem::OutOfMemoryError explains the state of the pool and what to try;
//  - small blocks freed by a thread are parked in that thread's private cache and handed back to
//    the same thread without taking the pool lock (the fast path).
//
// Ownership: the pool refers to its upstream (which must outlive it) and owns the segments it
// cached; allocations belong to the caller until deallocated.
// Thread-safety: every member may be called from any thread (see CachingPool below).
// Errors: construction throws ConfigError for inconsistent options; allocate() throws
// OutOfMemoryError (after one release-and-retry) describing the pool and what to try, and
// ConfigError for an alignment that is not a power of two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include <tandem/memory/memory_resource.h>
#include <tandem/memory/memory_stats.h>

namespace tandem::memory {

// Tuning of a CachingPool. The defaults are PyTorch's CUDA values, which also suit host memory.
struct CachingPoolOptions {
  std::string name = "pool";                    // appears in error messages and snapshots
  std::size_t min_block_size = 512;              // rounding unit and block alignment (power of 2)
  std::size_t small_size = 1 << 20;              // requests up to this use the small pool
  std::size_t small_segment_size = 2 << 20;      // segment size of the small pool
  std::size_t large_segment_size = 20 << 20;     // segment size for large requests below...
  std::size_t large_segment_threshold = 10 << 20;  // ...this; bigger ones get their own segment
  std::size_t segment_rounding = 2 << 20;        // own segments are rounded up to this
  // Alignment asked of the upstream for segments, capped at what it honours (max_alignment()):
  // a page on the host, 256 bytes from cudaMalloc. Cached blocks are aligned to
  // min(that, min_block_size).
  std::size_t segment_alignment = 4096;
  // Blocks larger than this are never split (SIZE_MAX: no limit). See the header comment.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // 0: round to min_block_size only. N > 1 (a power of two): round requests above
  // min_block_size up to the next of N equal steps between two powers of two.
  std::size_t roundup_power2_divisions = 0;
  // Lock-free per-thread cache of recently freed small blocks (default stream only).
  bool thread_cache = true;
  std::size_t thread_cache_max_block = 256 << 10;  // largest block a thread cache keeps
  std::size_t thread_cache_bin_capacity = 8;       // blocks kept per size
  std::size_t thread_cache_max_bytes = 4 << 20;    // bytes kept per thread
};

// The caching allocator. Thread-safe: the fast path (a thread re-allocating a small size it freed
// recently) touches only that thread's cache; everything else takes the pool's mutex.
// Alignments up to block_alignment() are served from the cache; larger ones get a dedicated
// upstream allocation that is returned to the upstream when freed (and throw ConfigError beyond
// the upstream's max_alignment()).
// Destroying the pool returns all cached memory upstream; segments that still hold live
// allocations are left to the upstream (the memory is not unmapped under its users).
class CachingPool final : public MemoryResource {
 public:
  // `upstream` provides segments and must outlive the pool.
  explicit CachingPool(MemoryResource& upstream, CachingPoolOptions options = {});
  ~CachingPool() override;

  // Returns every fully free cached segment (thread caches included) to the upstream.
  // Same as release_cached(). Returns the bytes released. Thread-safe.
  std::size_t release() { return release_cached(); }

  // Sets every peak to its current value. Thread-safe.
  void reset_peak();

  // This pool's statistics (equivalent to collect_stats() on an empty MemoryStats, without the
  // upstream's). Thread-safe.
  MemoryStats stats() const;

  // The rounded size a request of `bytes` occupies in this pool.
  std::size_t round_size(std::size_t bytes) const;

  // The options the pool was built with.
  const CachingPoolOptions& options() const;

  // The alignment every cached block has: min(segment_alignment, upstream's max_alignment(),
  // min_block_size). Requests for more get a dedicated upstream allocation.
  std::size_t block_alignment() const;

  // Implementation, public only so that thread-exit hooks in the .cpp can name it.
  struct Impl;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     StreamId stream) noexcept override;
  std::size_t do_release_cached() override;
  void do_collect_stats(MemoryStats& stats) const override;
  void do_collect_snapshot(Snapshot& snapshot) const override;
  std::size_t do_max_alignment() const noexcept override;

  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::memory
