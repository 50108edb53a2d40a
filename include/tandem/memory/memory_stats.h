// Allocator statistics, modelled on PyTorch's torch.cuda.memory_stats().
//
// Ownership: plain values.
// Thread-safety: values; the formatting functions are reentrant.
// Errors: none (the functions do not throw, except std::bad_alloc).
#pragma once

#include <cstdint>
#include <string>

namespace tandem::memory {

// One statistic: its value now, its high-water mark since the last reset_peak(), and running
// totals of what was added and removed (total - freed == current).
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t total = 0;  // sum of all increases ("allocated" in PyTorch's naming)
  std::int64_t freed = 0;  // sum of all decreases
};

// Figures gathered by MemoryResource::collect_stats() down a stack of layers. Fields stay zero
// when no layer in the stack fills them.
//
// Filled by CachingPool (PyTorch's meanings):
//   allocated_bytes/allocations  blocks handed to callers (sizes after rounding)
//   reserved_bytes/segments      memory obtained from the backend, cached or not
//   active_bytes/active_blocks   blocks not reusable by other callers: allocated + parked in a
//                                thread's private cache
//   inactive_split_bytes/blocks  free blocks inside partly used segments (cannot be released;
//                                a large figure means fragmentation)
//   cache_hits/cache_misses      allocations served from cache / needing a new segment
//   thread_cache_hits            of cache_hits, served lock-free from the caller's thread cache
//   alloc_retries, ooms          cache flushes on backend failure; OutOfMemoryErrors thrown
//   largest_free_block           biggest free cached block (0 if none)
// Filled by StatisticsResource:
//   requested_bytes/requests     exactly what callers asked for, before rounding
// Filled by LimitingResource:
//   limit_bytes                  the cap (0: no limiting layer)
struct MemoryStats {
  Stat allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes;
  Stat allocations, segments, active_blocks, inactive_split_blocks;
  Stat requested_bytes, requests;
  std::int64_t cache_hits = 0, cache_misses = 0, thread_cache_hits = 0;
  std::int64_t alloc_retries = 0, ooms = 0;
  std::int64_t largest_free_block = 0;
  std::int64_t limit_bytes = 0;

  // cache_hits / (cache_hits + cache_misses), or 0 with no allocations.
  double cache_hit_rate() const {
    const auto n = cache_hits + cache_misses;
    return n == 0 ? 0.0 : static_cast<double>(cache_hits) / static_cast<double>(n);
  }

  // Fragmentation of the cache: 1 - largest_free_block / (reserved - active), i.e. the share of
  // the free cached memory that a single request as large as all of it could not use. 0 when
  // nothing is free or all free memory is one block.
  double fragmentation() const;
};

// Multi-line, human-readable table of `stats` (bytes as KiB/MiB/GiB).
std::string format_stats(const MemoryStats& stats);

// JSON object of `stats` (every Stat as {"current","peak","total","freed"}).
std::string stats_to_json(const MemoryStats& stats);

// "1.5 MiB"-style rendering of a byte count.
std::string format_bytes(std::int64_t bytes);

}  // namespace tandem::memory
