// CachingPoolOptions: consistency checks, and the segment alignment negotiated with the upstream.
#include <algorithm>
#include <string>

#include <tandem/base/errors.h>

#include "memory/caching_pool_impl.h"

namespace tandem::memory {

void validate_pool_options(const CachingPoolOptions& o) {
  auto fail = [&](const std::string& what) {
    throw ConfigError("CachingPool '" + o.name + "': " + what);
  };
  if (!is_pow2(o.min_block_size)) fail("min_block_size must be a power of two, got " + std::to_string(o.min_block_size));
  if (!is_pow2(o.segment_alignment) || o.segment_alignment < o.min_block_size)
    fail("segment_alignment must be a power of two >= min_block_size, got " + std::to_string(o.segment_alignment));
  if (o.small_size < o.min_block_size || o.small_size > o.small_segment_size)
    fail("need min_block_size <= small_size <= small_segment_size, got small_size " + std::to_string(o.small_size));
  if (o.small_segment_size % o.min_block_size != 0 || o.large_segment_size % o.min_block_size != 0 ||
      o.segment_rounding % o.min_block_size != 0 || o.segment_rounding == 0)
    fail("segment sizes and segment_rounding must be non-zero multiples of min_block_size");
  if (o.large_segment_threshold > o.large_segment_size)
    fail("large_segment_threshold must not exceed large_segment_size");
  if (o.roundup_power2_divisions != 0 && !is_pow2(o.roundup_power2_divisions))
    fail("roundup_power2_divisions must be 0 or a power of two, got " + std::to_string(o.roundup_power2_divisions));
  if (o.thread_cache && (o.thread_cache_bin_capacity == 0 || o.thread_cache_max_block < o.min_block_size))
    fail("thread_cache needs thread_cache_bin_capacity > 0 and thread_cache_max_block >= min_block_size");
}

// Negotiated, not imposed: the default asks for a page, which host memory gives and cudaMalloc
// (256 bytes guaranteed) does not. Asking less only lowers block_alignment; requests above it
// still get a dedicated upstream allocation, which refuses what the upstream cannot do.
std::size_t negotiate_segment_alignment(const CachingPoolOptions& o, const MemoryResource& upstream) {
  const std::size_t up_max = upstream.max_alignment();
  if (!is_pow2(up_max))
    throw ConfigError("CachingPool '" + o.name + "': the upstream's max_alignment() must be a power of two, got " +
                      std::to_string(up_max) + "; fix that resource's do_max_alignment()");
  return std::min(o.segment_alignment, up_max);
}

}  // namespace tandem::memory
