// HostBackend: the bottom of a host-memory stack. Large requests are mmap'd (so freeing them
// returns memory to the OS at once), small ones come from posix_memalign.
//
// Ownership: owns nothing but its counters; allocations belong to the caller until deallocated.
// Thread-safety: any thread (atomic counters only).
// Errors: OutOfMemoryError naming the size and errno when mmap/posix_memalign fails; ConfigError
// for an alignment that is not a power of two.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <tandem/memory/memory_resource.h>

namespace tandem::memory {

// Tuning of a HostBackend.
struct HostBackendOptions {
  std::size_t mmap_threshold = 1 << 20;  // requests of at least this many bytes are mmap'd
  bool transparent_huge_pages = false;   // madvise(MADV_HUGEPAGE) mmap'd regions >= 2 MiB
};

// Plain host memory. Any power-of-two alignment is honoured. Failures throw
// tandem::OutOfMemoryError naming the size and errno. Thread-safe (only atomic counters).
class HostBackend final : public MemoryResource {
 public:
  explicit HostBackend(HostBackendOptions options = {}) : options_(options) {}

  // Bytes currently handed out and not yet returned (for leak checks in tests). Thread-safe.
  std::int64_t outstanding_bytes() const { return outstanding_bytes_.load(); }
  // Number of allocations currently handed out. Thread-safe.
  std::int64_t outstanding_allocations() const { return outstanding_count_.load(); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept override;

  HostBackendOptions options_;
  std::atomic<std::int64_t> outstanding_bytes_{0}, outstanding_count_{0};
};

}  // namespace tandem::memory
