// HostBackend: posix_memalign for small requests, mmap for large ones.
#include <tandem/memory/host_backend.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <tandem/base/errors.h>
#include <tandem/memory/memory_stats.h>

namespace tandem::memory {
namespace {

std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

[[noreturn]] void fail(const char* how, std::size_t bytes, std::size_t alignment, int err) {
  throw OutOfMemoryError(std::string("tandem: HostBackend: ") + how + " of " + format_bytes(static_cast<std::int64_t>(bytes)) +
                         " (" + std::to_string(bytes) + " bytes, alignment " + std::to_string(alignment) +
                         ") failed: " + std::strerror(err) +
                         ". The machine is out of memory or an address-space limit (ulimit -v) was hit.");
}

}  // namespace

void* HostBackend::do_allocate(std::size_t bytes, std::size_t alignment, StreamId) {
  void* p = nullptr;
  if (bytes >= options_.mmap_threshold) {
    const std::size_t page = page_size();
    const std::size_t len = align_up(bytes, page);
    const std::size_t extra = alignment > page ? alignment : 0;
    void* m = ::mmap(nullptr, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("mmap", bytes, alignment, errno);
    auto base = reinterpret_cast<std::uintptr_t>(m);
    if (extra != 0) {  // trim to an aligned window
      const std::uintptr_t aligned = align_up(base, alignment);
      if (aligned > base) ::munmap(m, aligned - base);
      const std::size_t tail = (base + len + extra) - (aligned + len);
      if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + len), tail);
      base = aligned;
    }
    p = reinterpret_cast<void*>(base);
#ifdef MADV_HUGEPAGE
    if (options_.transparent_huge_pages && len >= (2u << 20)) ::madvise(p, len, MADV_HUGEPAGE);
#endif
  } else {
    const std::size_t a = alignment < sizeof(void*) ? sizeof(void*) : alignment;
    const int rc = ::posix_memalign(&p, a, bytes);
    if (rc != 0) fail("posix_memalign", bytes, alignment, rc);
  }
  outstanding_bytes_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  outstanding_count_.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void HostBackend::do_deallocate(void* p, std::size_t bytes, std::size_t, StreamId) noexcept {
  if (bytes >= options_.mmap_threshold) ::munmap(p, align_up(bytes, page_size()));
  else std::free(p);
  outstanding_bytes_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  outstanding_count_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace tandem::memory
