// Helpers shared by the core memory tests: fill/verify patterns and invariant checks of a pool
// against its snapshot.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>

#include <tandem/memory/caching_pool.h>
#include <tandem/memory/snapshot.h>

namespace tandem::memory::testing {

// Writes a pattern derived from `tag` at a few places of [p, p+n).
inline void fill(void* p, std::size_t n, std::uint32_t tag) {
  auto* c = static_cast<unsigned char*>(p);
  const std::size_t pos[] = {0, n / 3, n / 2, n - 1};
  for (std::size_t i : pos) c[i] = static_cast<unsigned char>(tag * 31u + i);
  if (n >= 8) std::memcpy(c + (n - 8) / 2 / 4 * 4, &tag, 4);
}

// True when the pattern of fill() is intact.
inline bool check(const void* p, std::size_t n, std::uint32_t tag) {
  auto* c = static_cast<const unsigned char*>(p);
  const std::size_t pos[] = {0, n / 3, n / 2, n - 1};
  std::uint32_t t = 0;
  if (n >= 8) std::memcpy(&t, c + (n - 8) / 2 / 4 * 4, 4);
  if (n >= 8 && t != tag) return false;
  // The tag write may have overwritten one of the byte positions; re-fill order matters, so
  // only check bytes that lie outside the tag word.
  const std::size_t tw = n >= 8 ? (n - 8) / 2 / 4 * 4 : n;
  for (std::size_t i : pos) {
    if (n >= 8 && i >= tw && i < tw + 4) continue;
    if (c[i] != static_cast<unsigned char>(tag * 31u + i)) return false;
  }
  return true;
}

// Checks a pool's snapshot and stats against the set of live pointers the test holds
// (address -> requested bytes). `allow_thread_cached` when other threads may park blocks.
inline void check_pool_invariants(const CachingPool& pool, const std::map<std::uintptr_t, std::size_t>& live,
                                  std::int64_t backend_outstanding) {
  const Snapshot snap = take_snapshot(pool);
  const MemoryStats s = snap.stats;
  std::int64_t reserved = 0, allocated = 0, active = 0, inactive_split = 0, largest = 0;
  std::int64_t allocated_blocks = 0;
  std::set<std::uintptr_t> seen;
  for (const auto& seg : snap.segments) {
    reserved += static_cast<std::int64_t>(seg.size);
    std::uintptr_t at = seg.address;
    ASSERT_FALSE(seg.blocks.empty());
    for (const auto& b : seg.blocks) {
      ASSERT_EQ(b.address, at) << "blocks must tile their segment";
      at += b.size;
      if (b.state == BlockState::kFree) {
        largest = std::max<std::int64_t>(largest, static_cast<std::int64_t>(b.size));
        if (seg.blocks.size() > 1) inactive_split += static_cast<std::int64_t>(b.size);
      } else {
        active += static_cast<std::int64_t>(b.size);
      }
      if (b.state == BlockState::kAllocated) {
        allocated += static_cast<std::int64_t>(b.size);
        ++allocated_blocks;
        auto it = live.find(b.address);
        ASSERT_NE(it, live.end()) << "pool says allocated, test does not hold it";
        ASSERT_GE(b.size, it->second);
        seen.insert(b.address);
      }
    }
    ASSERT_EQ(at, seg.address + seg.size);
  }
  ASSERT_EQ(seen.size(), live.size()) << "a live pointer is not an allocated block";
  EXPECT_EQ(s.reserved_bytes.current, reserved);
  EXPECT_EQ(s.reserved_bytes.current, backend_outstanding);
  EXPECT_EQ(s.allocated_bytes.current, allocated);
  EXPECT_EQ(s.allocations.current, allocated_blocks);
  EXPECT_EQ(s.active_bytes.current, active);
  EXPECT_EQ(s.inactive_split_bytes.current, inactive_split);
  EXPECT_EQ(s.largest_free_block, largest);
  EXPECT_EQ(s.allocated_bytes.total - s.allocated_bytes.freed, s.allocated_bytes.current);
  EXPECT_EQ(s.allocations.total - s.allocations.freed, s.allocations.current);
  EXPECT_LE(s.allocated_bytes.current, s.allocated_bytes.peak);
  EXPECT_LE(s.allocated_bytes.current, s.reserved_bytes.current);
}

}  // namespace tandem::memory::testing
