// LimitingResource: caps the bytes outstanding through it.
//
// Ownership: refers to its upstream (which must outlive it); owns only its counter.
// Thread-safety: any thread, lock-free.
// Errors: OutOfMemoryError when an allocation would exceed the cap (naming the cap and the use).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <tandem/memory/memory_resource.h>

namespace tandem::memory {

// Refuses allocations that would take the bytes outstanding through it above `limit_bytes`,
// throwing tandem::OutOfMemoryError (which a CachingPool above it answers by releasing its cache
// and retrying). Put it below a CachingPool to cap reserved memory, like PyTorch's
// set_per_process_memory_fraction:  CachingPool(LimitingResource(HostBackend, cap)).
// Thread-safe and lock-free (one compare-exchange per allocation).
class LimitingResource final : public AdaptorResource {
 public:
  LimitingResource(MemoryResource& upstream, std::size_t limit_bytes)
      : AdaptorResource(upstream), limit_(limit_bytes) {}

  // The cap.
  std::size_t limit() const { return limit_; }
  // Bytes outstanding through this layer.
  std::size_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept override;
  void do_collect_stats(MemoryStats& stats) const override;

  const std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace tandem::memory
