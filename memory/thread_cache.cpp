// The lock-free fast path of CachingPool: each thread keeps, per pool, a few recently freed
// small blocks per size and hands them back to itself without touching the pool mutex.
//
// Ownership: a ThreadCache is shared by the thread (thread_local list) and the pool (registry).
// Lock order: a cache's spin lock may be held while taking the pool mutex (thread exit), never
// the other way round; flushes copy a cache's blocks out and drop its lock before taking mu.
#include <algorithm>

#include "memory/caching_pool_impl.h"

namespace tandem::memory {
namespace {

struct TlsEntry {
  std::uint64_t pool_id;
  std::shared_ptr<ThreadCache> cache;
};

// Hands this thread's cached blocks back to their pools when the thread exits.
struct TlsCaches {
  std::vector<TlsEntry> entries;
  ~TlsCaches();
};

// Set once this thread's TlsCaches is destroyed: frees that run later during thread exit (other
// thread_local destructors) take the locked path instead of touching a dead cache list.
thread_local bool t_caches_dead = false;

TlsCaches::~TlsCaches() {
  {
    for (auto& e : entries) {
      ThreadCache& c = *e.cache;
      std::lock_guard<SpinLock> lock(c.lock);
      CachingPool::Impl* owner = c.owner.load();
      if (owner == nullptr) continue;
      std::vector<void*> blocks;
      for (std::size_t bin = 0; bin < c.counts.size(); ++bin) {
        const std::size_t cap = owner->opt.thread_cache_bin_capacity;
        for (std::uint32_t i = 0; i < c.counts[bin]; ++i) blocks.push_back(c.slots[bin * cap + i]);
        c.counts[bin] = 0;
      }
      // The pool cannot be destroyed meanwhile: its destructor waits for this cache's lock.
      owner->return_cached(blocks);
      {
        std::lock_guard<std::mutex> pool_lock(owner->mu);
        owner->retired.pop_bytes += c.pop_bytes;
        owner->retired.pop_count += c.pop_count;
        owner->retired.push_bytes += c.push_bytes;
        owner->retired.push_count += c.push_count;
      }
      c.held_bytes = c.held_blocks = 0;
      c.owner.store(nullptr);
    }
  }
  t_caches_dead = true;
}

thread_local TlsCaches t_caches;

ThreadCache* find_cache(CachingPool::Impl& pool) {
  if (t_caches_dead) return nullptr;
  for (auto& e : t_caches.entries)
    if (e.pool_id == pool.id) return e.cache.get();
  // First use of this pool by this thread: forget caches of pools that are gone.
  auto& v = t_caches.entries;
  v.erase(std::remove_if(v.begin(), v.end(), [](const TlsEntry& e) { return e.cache->owner.load() == nullptr; }),
          v.end());
  v.push_back({pool.id, pool.make_thread_cache()});
  return v.back().cache.get();
}

}  // namespace

std::shared_ptr<ThreadCache> CachingPool::Impl::make_thread_cache() {
  auto c = std::make_shared<ThreadCache>();
  c->slots.assign(cache_bins * opt.thread_cache_bin_capacity, nullptr);
  c->counts.assign(cache_bins, 0);
  c->owner.store(this);
  std::lock_guard<std::mutex> lock(caches_mu);
  caches.erase(std::remove_if(caches.begin(), caches.end(),
                              [](const std::shared_ptr<ThreadCache>& x) { return x->owner.load() == nullptr; }),
               caches.end());
  caches.push_back(c);
  return c;
}

void* CachingPool::Impl::cache_pop(std::size_t size) {
  ThreadCache* c = find_cache(*this);
  if (c == nullptr) return nullptr;
  const std::size_t bin = size / opt.min_block_size - 1;
  std::lock_guard<SpinLock> lock(c->lock);
  std::uint32_t& n = c->counts[bin];
  if (n == 0) return nullptr;
  void* p = c->slots[bin * opt.thread_cache_bin_capacity + --n];
  const auto s = static_cast<std::int64_t>(size);
  c->held_bytes -= s;
  c->held_blocks -= 1;
  c->pop_bytes += s;
  c->pop_count += 1;
  return p;
}

bool CachingPool::Impl::cache_push(void* p, std::size_t size) {
  ThreadCache* c = find_cache(*this);
  if (c == nullptr) return false;
  const std::size_t bin = size / opt.min_block_size - 1;
  const auto s = static_cast<std::int64_t>(size);
  std::lock_guard<SpinLock> lock(c->lock);
  std::uint32_t& n = c->counts[bin];
  if (n >= opt.thread_cache_bin_capacity ||
      c->held_bytes + s > static_cast<std::int64_t>(opt.thread_cache_max_bytes))
    return false;
  c->slots[bin * opt.thread_cache_bin_capacity + n++] = p;
  c->held_bytes += s;
  c->held_blocks += 1;
  c->push_bytes += s;
  c->push_count += 1;
  return true;
}

void CachingPool::Impl::return_cached(const std::vector<void*>& ps) {
  if (ps.empty()) return;
  std::lock_guard<std::mutex> lock(mu);
  for (void* p : ps) {
    auto it = live.find(p);
    if (it == live.end()) continue;
    Block* b = it->second;
    live.erase(it);
    free_block_locked(b);  // not a user free: the user-visible counters already saw it
  }
}

void CachingPool::Impl::flush_thread_caches() {
  if (!cache_enabled) return;
  std::vector<std::shared_ptr<ThreadCache>> all;
  {
    std::lock_guard<std::mutex> lock(caches_mu);
    all = caches;
  }
  std::vector<void*> blocks;
  const std::size_t cap = opt.thread_cache_bin_capacity;
  for (auto& c : all) {
    std::lock_guard<SpinLock> lock(c->lock);
    if (c->owner.load() == nullptr) continue;
    for (std::size_t bin = 0; bin < c->counts.size(); ++bin) {
      for (std::uint32_t i = 0; i < c->counts[bin]; ++i) blocks.push_back(c->slots[bin * cap + i]);
      c->counts[bin] = 0;
    }
    c->held_bytes = c->held_blocks = 0;
  }
  return_cached(blocks);
}

void CachingPool::Impl::detach_thread_caches() {
  std::lock_guard<std::mutex> lock(caches_mu);
  for (auto& c : caches) {
    std::lock_guard<SpinLock> cl(c->lock);
    std::fill(c->counts.begin(), c->counts.end(), 0);
    c->held_bytes = c->held_blocks = 0;
    c->owner.store(nullptr);
  }
  caches.clear();
}

CacheCounters CachingPool::Impl::sum_thread_caches(std::unordered_set<const void*>* cached) const {
  CacheCounters sum;
  if (!cache_enabled) return sum;
  std::vector<std::shared_ptr<ThreadCache>> all;
  {
    std::lock_guard<std::mutex> lock(caches_mu);
    all = caches;
  }
  const std::size_t cap = opt.thread_cache_bin_capacity;
  for (auto& c : all) {
    std::lock_guard<SpinLock> lock(c->lock);
    if (c->owner.load() == nullptr) continue;
    sum.add(*c);
    if (cached == nullptr) continue;
    for (std::size_t bin = 0; bin < c->counts.size(); ++bin)
      for (std::uint32_t i = 0; i < c->counts[bin]; ++i) cached->insert(c->slots[bin * cap + i]);
  }
  return sum;
}

}  // namespace tandem::memory
