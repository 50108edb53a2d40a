// StatisticsResource: lock-free request counters.
#include <tandem/memory/statistics_resource.h>

namespace tandem::memory {

void StatisticsResource::Counter::add(std::int64_t v) {
  const auto now = current.fetch_add(v, std::memory_order_relaxed) + v;
  total.fetch_add(v, std::memory_order_relaxed);
  auto p = peak.load(std::memory_order_relaxed);
  while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

void StatisticsResource::Counter::sub(std::int64_t v) {
  current.fetch_sub(v, std::memory_order_relaxed);
  freed.fetch_add(v, std::memory_order_relaxed);
}

Stat StatisticsResource::Counter::get() const {
  Stat s;
  s.current = current.load(std::memory_order_relaxed);
  s.peak = peak.load(std::memory_order_relaxed);
  s.total = total.load(std::memory_order_relaxed);
  s.freed = freed.load(std::memory_order_relaxed);
  return s;
}

void* StatisticsResource::do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) {
  void* p = upstream().allocate(bytes, alignment, stream);
  bytes_.add(static_cast<std::int64_t>(bytes));
  count_.add(1);
  return p;
}

void StatisticsResource::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept {
  bytes_.sub(static_cast<std::int64_t>(bytes));
  count_.sub(1);
  upstream().deallocate(p, bytes, alignment, stream);
}

void StatisticsResource::do_collect_stats(MemoryStats& stats) const {
  upstream().collect_stats(stats);
  stats.requested_bytes = bytes_.get();
  stats.requests = count_.get();
}

MemoryStats StatisticsResource::stats() const {
  MemoryStats s;
  collect_stats(s);
  return s;
}

void StatisticsResource::reset_peak() {
  bytes_.peak.store(bytes_.current.load());
  count_.peak.store(count_.current.load());
}

}  // namespace tandem::memory
