// Property tests: random allocate/free/release sequences checked against a reference model:
// no overlap, alignment, contents intact, stats consistent with the snapshot, and every byte
// returned to the backend at the end.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>
#include <vector>

#include <tandem/memory/host_backend.h>

#include "tests/memory/memory_test_util.h"

namespace tmem = tandem::memory;

namespace {

struct Live {
  std::size_t bytes;
  std::size_t align;
  tmem::StreamId stream;
  std::uint32_t tag;
};

tmem::CachingPoolOptions config(int which) {
  tmem::CachingPoolOptions o;
  switch (which) {
    case 0: break;  // defaults, thread cache on
    case 1: o.thread_cache = false; break;
    case 2:
      o.roundup_power2_divisions = 4;
      o.max_split_size = 4 << 20;
      break;
    case 3:  // tiny segments: lots of splitting, merging and new segments
      o.small_size = 16 << 10;
      o.small_segment_size = 64 << 10;
      o.large_segment_size = 256 << 10;
      o.large_segment_threshold = 128 << 10;
      o.segment_rounding = 64 << 10;
      o.thread_cache_max_block = 8 << 10;
      o.thread_cache_bin_capacity = 2;
      break;
  }
  return o;
}

std::size_t random_size(std::mt19937_64& rng) {
  const int kind = static_cast<int>(rng() % 100);
  if (kind < 70) return 1 + rng() % 4096;
  if (kind < 90) return 1 + rng() % (256 << 10);
  if (kind < 98) return 1 + rng() % (4 << 20);
  return 1 + rng() % (24 << 20);
}

class PoolProperty : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PoolProperty, RandomSequencesMatchModel) {
  const auto [which, seed] = GetParam();
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919 + static_cast<std::uint64_t>(which));
  tmem::HostBackend host;
  {
    tmem::CachingPool pool(host, config(which));
    std::map<std::uintptr_t, Live> live;          // address -> what was asked
    std::map<std::uintptr_t, std::uintptr_t> ranges;  // address -> end (requested bytes)
    const std::size_t aligns[] = {0, 16, 64, 256, 512, 4096, 1 << 16};
    std::uint32_t next_tag = 1;
    auto free_one = [&](std::map<std::uintptr_t, Live>::iterator it) {
      auto* p = reinterpret_cast<void*>(it->first);
      ASSERT_TRUE(tmem::testing::check(p, it->second.bytes, it->second.tag)) << "contents corrupted";
      pool.deallocate(p, it->second.bytes, it->second.align, it->second.stream);
      ranges.erase(it->first);
      live.erase(it);
    };
    for (int op = 0; op < 3000; ++op) {
      const int r = static_cast<int>(rng() % 100);
      if (r < 55 || live.empty()) {
        const std::size_t n = random_size(rng);
        const std::size_t a = aligns[rng() % 7];
        const tmem::StreamId st{rng() % 5 == 0 ? 1u : 0u};
        void* p = pool.allocate(n, a, st);
        ASSERT_NE(p, nullptr);
        const auto addr = reinterpret_cast<std::uintptr_t>(p);
        ASSERT_EQ(addr % (a == 0 ? tmem::kDefaultAlignment : a), 0u) << "misaligned";
        auto next = ranges.lower_bound(addr);
        if (next != ranges.end()) {
          ASSERT_LE(addr + n, next->first) << "overlaps the next allocation";
        }
        if (next != ranges.begin()) {
          ASSERT_LE(std::prev(next)->second, addr) << "overlaps the previous one";
        }
        ranges.emplace(addr, addr + n);
        live.emplace(addr, Live{n, a, st, next_tag});
        tmem::testing::fill(p, n, next_tag++);
      } else if (r < 98) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        free_one(it);
      } else {
        pool.release();
      }
      if (op % 250 == 0) {
        std::map<std::uintptr_t, std::size_t> asked;
        for (const auto& [addr, l] : live) asked.emplace(addr, l.bytes);
        tmem::testing::check_pool_invariants(pool, asked, host.outstanding_bytes());
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
    while (!live.empty()) free_one(live.begin());
    const auto s = pool.stats();
    EXPECT_EQ(s.allocated_bytes.current, 0);
    EXPECT_EQ(s.allocations.total, s.allocations.freed);
    pool.release();
    EXPECT_EQ(pool.stats().reserved_bytes.current, 0);
    EXPECT_EQ(host.outstanding_bytes(), 0) << "memory not returned on release";
  }
  EXPECT_EQ(host.outstanding_allocations(), 0);
}

INSTANTIATE_TEST_SUITE_P(Configs, PoolProperty,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3)));

}  // namespace
