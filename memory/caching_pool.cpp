// CachingPool: segments, best-fit blocks, split/merge, release, out-of-memory handling.
// The per-thread fast path lives in thread_cache.cpp.
#include <tandem/memory/caching_pool.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <new>
#include <sstream>

#include <tandem/base/errors.h>
#include <tandem/memory/snapshot.h>

#include "memory/caching_pool_impl.h"

namespace tandem::memory {
namespace {

std::atomic<std::uint64_t> g_next_pool_id{1};

std::size_t floor_pow2(std::size_t n) {
  std::size_t p = 1;
  while (p <= n / 2) p <<= 1;
  return p;
}

}  // namespace

CachingPool::Impl::Impl(MemoryResource& up, CachingPoolOptions o)
    : upstream(up), opt(std::move(o)), id(g_next_pool_id.fetch_add(1)) {
  validate_pool_options(opt);
  segment_alignment = negotiate_segment_alignment(opt, upstream);
  block_alignment = std::min(segment_alignment, opt.min_block_size);
  opt.thread_cache_max_block = std::min(opt.thread_cache_max_block, opt.small_size);
  cache_enabled = opt.thread_cache;
  cache_bins = opt.thread_cache_max_block / opt.min_block_size;
}

std::size_t CachingPool::Impl::round_size(std::size_t bytes) const {
  const std::size_t m = opt.min_block_size;
  if (bytes <= m) return m;
  std::size_t step = m;
  if (opt.roundup_power2_divisions > 1) step = std::max(m, floor_pow2(bytes) / opt.roundup_power2_divisions);
  return align_up(bytes, step);
}

void CachingPool::Impl::note_alloc(std::int64_t size) {
  const auto b = alloc_bytes.fetch_add(size, std::memory_order_relaxed) + size;
  auto peak = alloc_bytes_peak.load(std::memory_order_relaxed);
  while (b > peak && !alloc_bytes_peak.compare_exchange_weak(peak, b, std::memory_order_relaxed)) {
  }
  const auto c = alloc_count.fetch_add(1, std::memory_order_relaxed) + 1;
  auto cpeak = alloc_count_peak.load(std::memory_order_relaxed);
  while (c > cpeak && !alloc_count_peak.compare_exchange_weak(cpeak, c, std::memory_order_relaxed)) {
  }
}

void CachingPool::Impl::note_free(std::int64_t size) {
  alloc_bytes.fetch_sub(size, std::memory_order_relaxed);
  alloc_count.fetch_sub(1, std::memory_order_relaxed);
}

// ---- allocation --------------------------------------------------------------------------

void* CachingPool::Impl::allocate(std::size_t bytes, std::size_t alignment, StreamId stream) {
  const bool aligned = alignment > block_alignment;
  const std::size_t size = round_size(bytes);
  if (!aligned && cache_enabled && stream.value == 0 && size <= opt.thread_cache_max_block) {
    if (void* p = cache_pop(size)) {
      note_alloc(static_cast<std::int64_t>(size));
      return p;
    }
  }
  std::string upstream_error;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1) flush_thread_caches();  // never under mu: caches lock before the pool
    std::lock_guard<std::mutex> lock(mu);
    if (attempt == 1) {
      ++retries;
      release_locked();
    }
    Block* b = aligned ? alloc_aligned_locked(size, alignment, stream, &upstream_error)
                       : alloc_locked(size, stream, &upstream_error);
    if (b != nullptr) {
      ++locked_alloc_count;
      locked_alloc_bytes += static_cast<std::int64_t>(b->size);
      note_alloc(static_cast<std::int64_t>(b->size));
      return b->ptr;
    }
    if (attempt == 1) {
      ++ooms;
      throw OutOfMemoryError(oom_message_locked(bytes, alignment, stream, upstream_error));
    }
  }
  return nullptr;  // unreachable
}

namespace {
// Calls upstream.allocate(), turning its out-of-memory failure into nullptr + message.
void* try_upstream(MemoryResource& up, std::size_t size, std::size_t alignment, StreamId stream,
                   std::string* error) {
  try {
    return up.allocate(size, alignment, stream);
  } catch (const OutOfMemoryError& e) {
    *error = e.what();
  } catch (const std::bad_alloc& e) {
    *error = std::string("std::bad_alloc: ") + e.what();
  }
  return nullptr;
}
}  // namespace

Block* CachingPool::Impl::alloc_locked(std::size_t size, StreamId stream, std::string* upstream_error) {
  const bool small = size <= opt.small_size;
  auto& free_set = small ? small_free : large_free;
  Block key;
  key.stream = stream;
  key.size = size;
  Block* b = nullptr;
  auto it = free_set.lower_bound(&key);
  if (it != free_set.end() && (*it)->stream == stream) {
    Block* cand = *it;
    const std::size_t ms = opt.max_split_size;
    const bool oversized_for_small = size < ms && cand->size >= ms;
    const bool too_big = size >= ms && cand->size >= size + opt.large_segment_size;
    if (!oversized_for_small && !too_big) {
      free_set.erase(it);
      b = cand;
      if (b->prev || b->next) {
        stat_add(inactive_split, -static_cast<std::int64_t>(b->size));
        stat_add(inactive_split_blocks, -1);
      }
      ++hits;
    }
  }
  if (b == nullptr) {
    std::size_t seg_size;
    if (small) seg_size = opt.small_segment_size;
    else if (size < opt.large_segment_threshold) seg_size = opt.large_segment_size;
    else seg_size = align_up(size, opt.segment_rounding);
    void* mem = try_upstream(upstream, seg_size, segment_alignment, stream, upstream_error);
    if (mem == nullptr) return nullptr;
    ++misses;
    auto* seg = new Segment{static_cast<char*>(mem), seg_size, segment_alignment, stream,
                            small ? PoolKind::kSmall : PoolKind::kLarge, nullptr};
    b = arena.make<Block>();
    b->ptr = seg->base;
    b->size = seg_size;
    b->stream = stream;
    b->segment = seg;
    seg->first = b;
    segments.insert(seg);
    stat_add(reserved, static_cast<std::int64_t>(seg_size));
    stat_add(segment_count, 1);
  }
  // Split off the tail when it is worth keeping.
  const std::size_t remaining = b->size - size;
  const bool split = small ? remaining >= opt.min_block_size
                           : (size < opt.max_split_size && remaining > opt.small_size);
  if (split) {
    auto* r = arena.make<Block>();
    r->ptr = b->ptr + size;
    r->size = remaining;
    r->stream = stream;
    r->segment = b->segment;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    free_set.insert(r);
    stat_add(inactive_split, static_cast<std::int64_t>(remaining));
    stat_add(inactive_split_blocks, 1);
  }
  b->allocated = true;
  live.emplace(b->ptr, b);
  stat_add(active, static_cast<std::int64_t>(b->size));
  stat_add(active_blocks, 1);
  return b;
}

Block* CachingPool::Impl::alloc_aligned_locked(std::size_t size, std::size_t alignment,
                                                StreamId stream, std::string* upstream_error) {
  void* mem = try_upstream(upstream, size, alignment, stream, upstream_error);
  if (mem == nullptr) return nullptr;
  ++misses;
  auto* seg = new Segment{static_cast<char*>(mem), size, alignment, stream, PoolKind::kAligned, nullptr};
  auto* b = arena.make<Block>();
  b->ptr = seg->base;
  b->size = size;
  b->stream = stream;
  b->segment = seg;
  b->allocated = true;
  seg->first = b;
  segments.insert(seg);
  live.emplace(b->ptr, b);
  stat_add(reserved, static_cast<std::int64_t>(size));
  stat_add(segment_count, 1);
  stat_add(active, static_cast<std::int64_t>(size));
  stat_add(active_blocks, 1);
  return b;
}

// ---- deallocation ------------------------------------------------------------------------

void CachingPool::Impl::deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                   StreamId stream) noexcept {
  const bool aligned = alignment > block_alignment;
  if (!aligned && cache_enabled && stream.value == 0) {
    const std::size_t size = round_size(bytes);
    if (size <= opt.thread_cache_max_block && cache_push(p, size)) {
      note_free(static_cast<std::int64_t>(size));
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = live.find(p);
  if (it == live.end()) {
    std::fprintf(stderr, "tandem: CachingPool '%s': deallocate(%p) of a pointer it did not allocate (ignored)\n",
                 opt.name.c_str(), p);
    return;
  }
  Block* b = it->second;
  live.erase(it);
  const auto size = static_cast<std::int64_t>(free_block_locked(b));
  ++locked_freed_count;
  locked_freed_bytes += size;
  note_free(size);
}

std::size_t CachingPool::Impl::free_block_locked(Block* b) {
  const std::size_t size = b->size;
  stat_add(active, -static_cast<std::int64_t>(size));
  stat_add(active_blocks, -1);
  Segment* seg = b->segment;
  if (seg->kind == PoolKind::kAligned) {
    upstream.deallocate(seg->base, seg->size, seg->alignment, seg->stream);
    stat_add(reserved, -static_cast<std::int64_t>(seg->size));
    stat_add(segment_count, -1);
    segments.erase(seg);
    arena.destroy(b);
    delete seg;
    return size;
  }
  auto& free_set = seg->kind == PoolKind::kSmall ? small_free : large_free;
  b->allocated = false;
  for (Block* n : {b->prev, b->next}) {
    if (n == nullptr || n->allocated) continue;
    free_set.erase(n);
    stat_add(inactive_split, -static_cast<std::int64_t>(n->size));
    stat_add(inactive_split_blocks, -1);
    if (n == b->prev) {
      b->ptr = n->ptr;
      b->prev = n->prev;
      if (b->prev) b->prev->next = b;
      else seg->first = b;
    } else {
      b->next = n->next;
      if (b->next) b->next->prev = b;
    }
    b->size += n->size;
    arena.destroy(n);
  }
  if (b->prev || b->next) {
    stat_add(inactive_split, static_cast<std::int64_t>(b->size));
    stat_add(inactive_split_blocks, 1);
  }
  free_set.insert(b);
  return size;
}

std::size_t CachingPool::Impl::release_locked() {
  std::size_t released = 0;
  for (auto* set : {&small_free, &large_free}) {
    for (auto it = set->begin(); it != set->end();) {
      Block* b = *it;
      if (b->prev || b->next) {
        ++it;
        continue;
      }
      it = set->erase(it);
      Segment* seg = b->segment;
      upstream.deallocate(seg->base, seg->size, seg->alignment, seg->stream);
      stat_add(reserved, -static_cast<std::int64_t>(seg->size));
      stat_add(segment_count, -1);
      released += seg->size;
      segments.erase(seg);
      arena.destroy(b);
      delete seg;
    }
  }
  return released;
}

std::size_t CachingPool::Impl::release() {
  flush_thread_caches();
  std::lock_guard<std::mutex> lock(mu);
  return release_locked();
}

void CachingPool::Impl::destroy() {
  flush_thread_caches();
  detach_thread_caches();
  std::lock_guard<std::mutex> lock(mu);
  release_locked();
  // Segments still holding live blocks stay with the upstream: unmapping them would pull memory
  // from under its users. Only the bookkeeping goes.
  if (!live.empty()) {
    std::fprintf(stderr,
                 "tandem: CachingPool '%s' destroyed with %zu live allocations (%s); their segments "
                 "are not returned to the upstream\n",
                 opt.name.c_str(), live.size(), format_bytes(alloc_bytes.load()).c_str());
  }
  for (Segment* seg : segments) {
    for (Block* b = seg->first; b != nullptr;) {
      Block* next = b->next;
      arena.destroy(b);
      b = next;
    }
    delete seg;
  }
  segments.clear();
  live.clear();
  small_free.clear();
  large_free.clear();
}

// ---- statistics and snapshots ------------------------------------------------------------

void CachingPool::Impl::fill_locked_stats(MemoryStats& s) const {
  s.reserved_bytes = reserved;
  s.segments = segment_count;
  s.active_bytes = active;
  s.active_blocks = active_blocks;
  s.inactive_split_bytes = inactive_split;
  s.inactive_split_blocks = inactive_split_blocks;
  s.alloc_retries = retries;
  s.ooms = ooms;
  std::int64_t largest = 0;
  for (const auto* set : {&small_free, &large_free})
    for (const Block* b : *set) largest = std::max<std::int64_t>(largest, static_cast<std::int64_t>(b->size));
  s.largest_free_block = largest;
}

void CachingPool::Impl::fill_stats(MemoryStats& s) const {
  std::int64_t lab, lac, lfb, lfc, h, m;
  CacheCounters ret;
  {
    std::lock_guard<std::mutex> lock(mu);
    fill_locked_stats(s);
    lab = locked_alloc_bytes; lac = locked_alloc_count;
    lfb = locked_freed_bytes; lfc = locked_freed_count;
    h = hits; m = misses;
    ret = retired;
  }
  CacheCounters c = sum_thread_caches(nullptr);
  c.pop_bytes += ret.pop_bytes; c.pop_count += ret.pop_count;
  c.push_bytes += ret.push_bytes; c.push_count += ret.push_count;
  s.allocated_bytes.current = alloc_bytes.load(std::memory_order_relaxed);
  s.allocated_bytes.peak = alloc_bytes_peak.load(std::memory_order_relaxed);
  s.allocated_bytes.total = lab + c.pop_bytes;
  s.allocated_bytes.freed = lfb + c.push_bytes;
  s.allocations.current = alloc_count.load(std::memory_order_relaxed);
  s.allocations.peak = alloc_count_peak.load(std::memory_order_relaxed);
  s.allocations.total = lac + c.pop_count;
  s.allocations.freed = lfc + c.push_count;
  s.cache_hits = h + c.pop_count;
  s.cache_misses = m;
  s.thread_cache_hits = c.pop_count;
}

void CachingPool::Impl::reset_peak() {
  alloc_bytes_peak.store(alloc_bytes.load());
  alloc_count_peak.store(alloc_count.load());
  std::lock_guard<std::mutex> lock(mu);
  for (Stat* s : {&reserved, &segment_count, &active, &active_blocks, &inactive_split, &inactive_split_blocks})
    s->peak = s->current;
}

void CachingPool::Impl::fill_snapshot(Snapshot& snap) const {
  std::unordered_set<const void*> cached;
  sum_thread_caches(&cached);
  std::lock_guard<std::mutex> lock(mu);
  std::vector<const Segment*> segs(segments.begin(), segments.end());
  std::sort(segs.begin(), segs.end(), [](const Segment* a, const Segment* b) { return a->base < b->base; });
  for (const Segment* seg : segs) {
    SegmentInfo si;
    si.address = reinterpret_cast<std::uintptr_t>(seg->base);
    si.size = seg->size;
    si.stream = seg->stream;
    si.pool = seg->kind == PoolKind::kSmall ? "small" : seg->kind == PoolKind::kLarge ? "large" : "aligned";
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      BlockInfo bi;
      bi.address = reinterpret_cast<std::uintptr_t>(b->ptr);
      bi.size = b->size;
      bi.state = !b->allocated ? BlockState::kFree
                 : cached.count(b->ptr) ? BlockState::kThreadCached
                                        : BlockState::kAllocated;
      si.blocks.push_back(bi);
    }
    snap.segments.push_back(std::move(si));
  }
}

std::string CachingPool::Impl::oom_message_locked(std::size_t bytes, std::size_t alignment,
                                                  StreamId stream,
                                                  const std::string& upstream_error) const {
  MemoryStats s;
  upstream.collect_stats(s);  // limit_bytes, if a LimitingResource is below us
  fill_locked_stats(s);
  s.allocated_bytes.current = alloc_bytes.load(std::memory_order_relaxed);
  const std::int64_t free_cached = s.reserved_bytes.current - s.active_bytes.current;
  std::ostringstream m;
  m << "tandem: out of memory in CachingPool '" << opt.name << "': requested "
    << format_bytes(static_cast<std::int64_t>(bytes)) << " (" << bytes << " bytes";
  if (alignment > kDefaultAlignment) m << ", alignment " << alignment;
  if (stream.value != 0) m << ", stream 0x" << std::hex << stream.value << std::dec;
  m << "); allocated " << format_bytes(s.allocated_bytes.current) << ", reserved "
    << format_bytes(s.reserved_bytes.current);
  if (s.limit_bytes > 0) m << " (limit " << format_bytes(s.limit_bytes) << ")";
  m << ", free in cache " << format_bytes(free_cached) << ", largest free block "
    << format_bytes(s.largest_free_block) << ", fragmentation "
    << static_cast<int>(s.fragmentation() * 100.0 + 0.5) << "%"
    << ". Cached memory was released and the allocation retried once. The upstream said: "
    << (upstream_error.empty() ? std::string("(nothing)") : upstream_error)
    << ". What to try: reduce the batch or model size; free tensors kept alive across steps "
       "(enable the leak detector, see docs/memory.md); ";
  if (s.fragmentation() > 0.5 && free_cached >= static_cast<std::int64_t>(bytes))
    m << "the free memory is fragmented, so set CachingPoolOptions::max_split_size (or "
         "roundup_power2_divisions) to limit splitting of large blocks; ";
  m << "or raise the memory limit. If the training state (parameters, gradients, optimizer state) "
       "is what fills it, shard it across the ranks: --set sharding.stage=3 "
       "(docs/sharded_data_parallel.md).";
  return m.str();
}

// ---- CachingPool -------------------------------------------------------------------------

CachingPool::CachingPool(MemoryResource& upstream, CachingPoolOptions options)
    : impl_(std::make_unique<Impl>(upstream, std::move(options))) {}

CachingPool::~CachingPool() { impl_->destroy(); }

void CachingPool::reset_peak() { impl_->reset_peak(); }

MemoryStats CachingPool::stats() const {
  MemoryStats s;
  impl_->fill_stats(s);
  return s;
}

std::size_t CachingPool::round_size(std::size_t bytes) const { return impl_->round_size(bytes); }

const CachingPoolOptions& CachingPool::options() const { return impl_->opt; }

std::size_t CachingPool::block_alignment() const { return impl_->block_alignment; }

std::size_t CachingPool::do_max_alignment() const noexcept { return impl_->upstream.max_alignment(); }

void* CachingPool::do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) {
  return impl_->allocate(bytes, alignment, stream);
}

void CachingPool::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept {
  impl_->deallocate(p, bytes, alignment, stream);
}

std::size_t CachingPool::do_release_cached() { return impl_->release(); }

void CachingPool::do_collect_stats(MemoryStats& s) const {
  impl_->upstream.collect_stats(s);
  impl_->fill_stats(s);
}

void CachingPool::do_collect_snapshot(Snapshot& s) const {
  impl_->upstream.collect_snapshot(s);
  impl_->fill_snapshot(s);
}

}  // namespace tandem::memory
