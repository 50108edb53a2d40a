// CachingPool behaviour: rounding, best fit, split/merge, release, streams, alignment, OOM.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <tandem/base/errors.h>
#include <tandem/memory/caching_pool.h>
#include <tandem/memory/host_backend.h>
#include <tandem/memory/limiting_resource.h>
#include <tandem/memory/snapshot.h>
#include <tandem/memory/statistics_resource.h>

namespace tmem = tandem::memory;

namespace {
tmem::CachingPoolOptions no_thread_cache() {
  tmem::CachingPoolOptions o;
  o.thread_cache = false;
  return o;
}
}  // namespace

TEST(CachingPool, RoundsToMinBlockAndPowerOfTwoDivisions) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  EXPECT_EQ(pool.round_size(1), 512u);
  EXPECT_EQ(pool.round_size(512), 512u);
  EXPECT_EQ(pool.round_size(513), 1024u);
  tmem::CachingPoolOptions o;
  o.roundup_power2_divisions = 4;
  tmem::CachingPool p4(host, o);
  EXPECT_EQ(p4.round_size(1 << 20), 1u << 20);
  EXPECT_EQ(p4.round_size((1 << 20) + 1), (1u << 20) + (1u << 18));  // next quarter step
  EXPECT_EQ(p4.round_size(1300), 1536u);
}

TEST(CachingPool, ReusesFreedBlockAndCountsHits) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host, no_thread_cache());
  void* a = pool.allocate(1000);
  pool.deallocate(a, 1000);
  void* b = pool.allocate(900);
  EXPECT_EQ(a, b);
  auto s = pool.stats();
  EXPECT_EQ(s.cache_misses, 1);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.segments.current, 1);
  EXPECT_EQ(s.reserved_bytes.current, 2 << 20);
  EXPECT_EQ(s.allocated_bytes.current, 1024);
  pool.deallocate(b, 900);
  EXPECT_EQ(pool.stats().allocated_bytes.current, 0);
  EXPECT_EQ(pool.release(), static_cast<std::size_t>(2 << 20));
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

TEST(CachingPool, SplitsAndCoalesces) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host, no_thread_cache());
  void* a = pool.allocate(512);
  void* b = pool.allocate(512);
  void* c = pool.allocate(512);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 512);
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 512);
  auto s = pool.stats();
  EXPECT_EQ(s.inactive_split_blocks.current, 1);  // the tail of the segment
  pool.deallocate(b, 512);
  s = pool.stats();
  EXPECT_EQ(s.inactive_split_blocks.current, 2);
  EXPECT_EQ(s.inactive_split_bytes.current, (2 << 20) - 3 * 512 + 512);
  pool.deallocate(a, 512);  // merges with b
  pool.deallocate(c, 512);  // merges everything back into one segment-sized block
  s = pool.stats();
  EXPECT_EQ(s.inactive_split_blocks.current, 0);
  EXPECT_EQ(s.largest_free_block, 2 << 20);
  auto snap = tmem::take_snapshot(pool);
  ASSERT_EQ(snap.segments.size(), 1u);
  ASSERT_EQ(snap.segments[0].blocks.size(), 1u);
  EXPECT_EQ(snap.segments[0].blocks[0].state, tmem::BlockState::kFree);
}

TEST(CachingPool, BestFitPicksSmallestFreeBlock) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host, no_thread_cache());
  // Carve free holes of 4 KiB and 2 KiB separated by live blocks.
  void* h4 = pool.allocate(4096);
  void* g1 = pool.allocate(512);
  void* h2 = pool.allocate(2048);
  void* g2 = pool.allocate(512);
  pool.deallocate(h4, 4096);
  pool.deallocate(h2, 2048);
  EXPECT_EQ(pool.allocate(1500), h2);  // the 2 KiB hole, not the 4 KiB one
  pool.deallocate(h2, 1500);
  pool.deallocate(g1, 512);
  pool.deallocate(g2, 512);
}

TEST(CachingPool, LargeRequestsUseLargePoolAndOwnSegments) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host, no_thread_cache());
  void* b = pool.allocate(12 << 20);  // >= 10 MiB: own segment rounded to 2 MiB
  void* a = pool.allocate(3 << 20);   // < 10 MiB: from a new 20 MiB segment
  auto s = pool.stats();
  EXPECT_EQ(s.segments.current, 2);
  EXPECT_EQ(s.reserved_bytes.current, (20 << 20) + (12 << 20));
  void* c = pool.allocate(5 << 20);  // best fit: the 17 MiB rest of the 20 MiB segment
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(a) + (3 << 20));
  EXPECT_EQ(pool.stats().segments.current, 2);
  pool.deallocate(a, 3 << 20);
  pool.deallocate(b, 12 << 20);
  pool.deallocate(c, 5 << 20);
  EXPECT_EQ(pool.release(), static_cast<std::size_t>(32 << 20));
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

TEST(CachingPool, MaxSplitSizeKeepsBigBlocksWhole) {
  tmem::HostBackend host;
  auto o = no_thread_cache();
  o.max_split_size = 8 << 20;
  tmem::CachingPool pool(host, o);
  void* big = pool.allocate(16 << 20);
  pool.deallocate(big, 16 << 20);
  void* small = pool.allocate(2 << 20);  // must not carve the 16 MiB block
  EXPECT_NE(small, big);
  void* again = pool.allocate(15 << 20);  // >= max_split and within 20 MiB: reuses it whole
  EXPECT_EQ(again, big);
  pool.deallocate(small, 2 << 20);
  pool.deallocate(again, 15 << 20);
}

TEST(CachingPool, StreamsDoNotShareBlocks) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  tmem::StreamId s1{1}, s2{2};
  void* a = pool.allocate(4096, 64, s1);
  pool.deallocate(a, 4096, 64, s1);
  void* b = pool.allocate(4096, 64, s2);
  EXPECT_NE(a, b);
  void* c = pool.allocate(4096, 64, s1);
  EXPECT_EQ(a, c);
  pool.deallocate(b, 4096, 64, s2);
  pool.deallocate(c, 4096, 64, s1);
}

TEST(CachingPool, HonoursLargeAlignments) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  for (std::size_t align : {64u, 512u, 4096u, 65536u, 1u << 21}) {
    void* p = pool.allocate(1000, align);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0u) << align;
    std::memset(p, 1, 1000);
    pool.deallocate(p, 1000, align);
  }
  pool.release();
  EXPECT_EQ(host.outstanding_bytes(), 0);
  EXPECT_THROW(pool.allocate(10, 48), tandem::ConfigError);
  EXPECT_EQ(pool.allocate(0), nullptr);
}

TEST(CachingPool, ThreadCacheServesSameThreadWithoutMisses) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  void* a = pool.allocate(1024);
  pool.deallocate(a, 1024);
  auto s = pool.stats();
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.active_bytes.current, 1024);  // parked in this thread's cache
  auto snap = tmem::take_snapshot(pool);
  EXPECT_EQ(snap.segments.at(0).blocks.at(0).state, tmem::BlockState::kThreadCached);
  for (int i = 0; i < 100; ++i) {
    void* b = pool.allocate(1000);
    EXPECT_EQ(a, b);
    pool.deallocate(b, 1000);
  }
  s = pool.stats();
  EXPECT_EQ(s.thread_cache_hits, 100);
  EXPECT_EQ(s.allocations.total, 101);
  EXPECT_EQ(s.allocations.freed, 101);
  EXPECT_EQ(pool.release(), static_cast<std::size_t>(2 << 20));  // flushes the thread cache first
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

TEST(CachingPool, ThreadCacheOfExitedThreadReturnsToPool) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  std::thread t([&] {
    void* p = pool.allocate(2048);
    pool.deallocate(p, 2048);
  });
  t.join();
  auto s = pool.stats();
  EXPECT_EQ(s.active_bytes.current, 0);
  EXPECT_EQ(s.allocations.total, 1);
  EXPECT_EQ(s.allocations.freed, 1);
  pool.release();
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

TEST(CachingPool, OutOfMemoryReleasesCacheRetriesThenExplains) {
  tmem::HostBackend host;
  tmem::LimitingResource cap(host, 24 << 20);
  tmem::CachingPool pool(cap, no_thread_cache());
  // A free 12 MiB segment sits in the cache; a 16 MiB request must release it to fit the cap.
  void* a = pool.allocate(12 << 20);
  pool.deallocate(a, 12 << 20);
  void* b = pool.allocate(16 << 20);
  EXPECT_EQ(pool.stats().alloc_retries, 1);
  EXPECT_EQ(pool.stats().reserved_bytes.current, 16 << 20);
  try {
    pool.allocate(16 << 20);
    FAIL() << "expected OutOfMemoryError";
  } catch (const tandem::OutOfMemoryError& e) {
    const std::string m = e.what();
    for (const char* part : {"requested 16.0 MiB", "allocated 16.0 MiB", "reserved 16.0 MiB", "limit 24.0 MiB",
                             "largest free block", "fragmentation", "What to try", "retried",
                             "--set sharding.stage=3", "docs/sharded_data_parallel.md"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " missing in: " << m;
  }
  EXPECT_EQ(pool.stats().ooms, 1);
  pool.deallocate(b, 16 << 20);
}

TEST(CachingPool, ResetPeak) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host, no_thread_cache());
  void* a = pool.allocate(1 << 16);
  pool.deallocate(a, 1 << 16);
  EXPECT_EQ(pool.stats().allocated_bytes.peak, 1 << 16);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().allocated_bytes.peak, 0);
  EXPECT_EQ(pool.stats().reserved_bytes.peak, 2 << 20);
}

TEST(StatisticsResource, CountsRequestsBeforeRounding) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  tmem::StatisticsResource stats(pool);
  void* a = stats.allocate(100);
  void* b = stats.allocate(3000);
  auto s = stats.stats();
  EXPECT_EQ(s.requested_bytes.current, 3100);
  EXPECT_EQ(s.requests.current, 2);
  EXPECT_EQ(s.allocated_bytes.current, 512 + 3072);
  stats.deallocate(a, 100);
  stats.deallocate(b, 3000);
  s = stats.stats();
  EXPECT_EQ(s.requested_bytes.current, 0);
  EXPECT_EQ(s.requested_bytes.peak, 3100);
  EXPECT_EQ(s.requests.total, 2);
  EXPECT_NE(tmem::format_stats(s).find("cache hit rate"), std::string::npos);
}

TEST(LimitingResource, RefusesAboveCap) {
  tmem::HostBackend host;
  tmem::LimitingResource cap(host, 1 << 20);
  void* a = cap.allocate(600 << 10);
  EXPECT_THROW(cap.allocate(600 << 10), tandem::OutOfMemoryError);
  cap.deallocate(a, 600 << 10);
  void* b = cap.allocate(1 << 20);
  EXPECT_EQ(cap.used(), 1u << 20);
  cap.deallocate(b, 1 << 20);
}

TEST(CachingPool, RejectsBadOptions) {
  tmem::HostBackend host;
  tmem::CachingPoolOptions o;
  o.min_block_size = 500;
  EXPECT_THROW(tmem::CachingPool(host, o), tandem::ConfigError);
}
