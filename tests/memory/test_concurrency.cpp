// Concurrency: many threads allocating, freeing each other's blocks, while another thread reads
// stats, takes snapshots and releases the cache. Run under TSan by scripts/test-memory-sanitizers.
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <tandem/memory/host_backend.h>
#include <tandem/memory/statistics_resource.h>
#include <tandem/memory/tracking_resource.h>

#include "tests/memory/memory_test_util.h"

namespace tmem = tandem::memory;

namespace {

struct Item {
  void* p;
  std::size_t n;
  std::uint32_t tag;
};

// Runs `threads` workers over `top`, half of the frees handed to another thread.
void hammer(tmem::MemoryResource& top, int threads, int ops, std::atomic<bool>& failed) {
  std::mutex handoff_mu;
  std::deque<Item> handoff;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      std::vector<Item> mine;
      for (int i = 0; i < ops; ++i) {
        const int r = static_cast<int>(rng() % 100);
        if (r < 50 || mine.empty()) {
          const std::size_t n = rng() % 10 == 0 ? 1 + rng() % (2 << 20) : 1 + rng() % 8192;
          void* p = top.allocate(n);
          const auto tag = static_cast<std::uint32_t>(t * 1000003 + i);
          tmem::testing::fill(p, n, tag);
          mine.push_back({p, n, tag});
        } else {
          Item it = mine.back();
          mine.pop_back();
          if (!tmem::testing::check(it.p, it.n, it.tag)) failed = true;
          if (r < 75) {
            std::lock_guard<std::mutex> lock(handoff_mu);
            handoff.push_back(it);
          } else {
            top.deallocate(it.p, it.n);
          }
        }
        if (i % 16 == 0) {  // free something another thread allocated
          std::unique_lock<std::mutex> lock(handoff_mu);
          if (!handoff.empty()) {
            Item it = handoff.front();
            handoff.pop_front();
            lock.unlock();
            if (!tmem::testing::check(it.p, it.n, it.tag)) failed = true;
            top.deallocate(it.p, it.n);
          }
        }
      }
      for (auto& it : mine) top.deallocate(it.p, it.n);
    });
  }
  for (auto& w : workers) w.join();
  for (auto& it : handoff) top.deallocate(it.p, it.n);
}

TEST(Concurrency, PoolWithStatsSnapshotsAndReleases) {
  tmem::HostBackend host;
  {
    tmem::CachingPool pool(host);
    tmem::StatisticsResource stats(pool);
    std::atomic<bool> failed{false}, done{false};
    std::thread observer([&] {
      std::int64_t rounds = 0;
      while (!done.load()) {
        auto s = stats.stats();
        if (s.allocated_bytes.current < 0 || s.reserved_bytes.current < 0) failed = true;
        auto snap = tmem::take_snapshot(pool);
        if (++rounds % 4 == 0) pool.release();
        std::this_thread::yield();
      }
    });
    hammer(stats, 4, 4000, failed);
    done = true;
    observer.join();
    EXPECT_FALSE(failed.load()) << "corrupted contents or negative stats";
    const auto s = stats.stats();
    EXPECT_EQ(s.allocated_bytes.current, 0);
    EXPECT_EQ(s.requested_bytes.current, 0);
    EXPECT_EQ(s.allocations.total, s.allocations.freed);
    pool.release();
    EXPECT_EQ(host.outstanding_bytes(), 0);
  }
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

TEST(Concurrency, TrackingWithSampledStacks) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  tmem::TrackingOptions o;
  o.stacks = tmem::StackCapture::kSampled;
  o.sample_every = 8;
  o.report_at_exit = false;
  tmem::TrackingResource track(pool, o);
  std::atomic<bool> failed{false}, done{false};
  std::thread stepper([&] {
    while (!done.load()) {
      track.mark_step();
      auto sites = track.live_by_site_fast();
      (void)sites;
      std::this_thread::yield();
    }
  });
  hammer(track, 4, 3000, failed);
  done = true;
  stepper.join();
  EXPECT_FALSE(failed.load());
  EXPECT_EQ(track.live_bytes(), 0);
  EXPECT_TRUE(track.live_allocations().empty());
}

TEST(Concurrency, ManyShortLivedThreadsLeaveNothingCached) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&] {
        for (int i = 0; i < 50; ++i) {
          void* p = pool.allocate(64 + 512 * static_cast<std::size_t>(i % 8));
          pool.deallocate(p, 64 + 512 * static_cast<std::size_t>(i % 8));
        }
      });
    for (auto& t : ts) t.join();
  }
  const auto s = pool.stats();
  EXPECT_EQ(s.active_bytes.current, 0) << "exited threads must hand their caches back";
  EXPECT_EQ(s.allocations.total, 20 * 4 * 50);
  EXPECT_EQ(s.allocations.freed, 20 * 4 * 50);
  pool.release();
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

}  // namespace
