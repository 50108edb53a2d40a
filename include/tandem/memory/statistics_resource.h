// StatisticsResource: counts what callers request, for any upstream.
//
// Ownership: refers to its upstream (which must outlive it).
// Thread-safety: any thread, lock-free.
// Errors: none of its own; allocate() throws what the upstream throws.
#pragma once

#include <atomic>
#include <cstdint>

#include <tandem/memory/memory_resource.h>
#include <tandem/memory/memory_stats.h>

namespace tandem::memory {

// Counts requested bytes and requests (current/peak/total/freed) exactly as callers asked,
// before any rounding below, and fills MemoryStats::requested_bytes/requests. Combine with a
// CachingPool below to see rounding overhead (allocated - requested).
// Thread-safe and lock-free (relaxed atomics; peaks via compare-exchange).
class StatisticsResource final : public AdaptorResource {
 public:
  explicit StatisticsResource(MemoryResource& upstream) : AdaptorResource(upstream) {}

  // The statistics of the whole stack: upstream's plus this layer's. Thread-safe.
  MemoryStats stats() const;

  // Sets this layer's peaks to their current values (and the pool's, through reset_peak on it
  // if you hold one). Thread-safe.
  void reset_peak();

 private:
  struct Counter {
    std::atomic<std::int64_t> current{0}, peak{0}, total{0}, freed{0};
    void add(std::int64_t v);
    void sub(std::int64_t v);
    Stat get() const;
  };

  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept override;
  void do_collect_stats(MemoryStats& stats) const override;

  Counter bytes_, count_;
};

}  // namespace tandem::memory
