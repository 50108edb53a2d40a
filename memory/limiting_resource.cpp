// LimitingResource: a cap on outstanding bytes.
#include <tandem/memory/limiting_resource.h>

#include <tandem/base/errors.h>
#include <tandem/memory/memory_stats.h>

namespace tandem::memory {

void* LimitingResource::do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) {
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || used > limit_ - bytes) {
      throw OutOfMemoryError("tandem: LimitingResource: allocating " + format_bytes(static_cast<std::int64_t>(bytes)) +
                             " would exceed the limit of " + format_bytes(static_cast<std::int64_t>(limit_)) +
                             " (in use " + format_bytes(static_cast<std::int64_t>(used)) +
                             "); raise the limit or use less memory");
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  try {
    return upstream().allocate(bytes, alignment, stream);
  } catch (...) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    throw;
  }
}

void LimitingResource::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept {
  upstream().deallocate(p, bytes, alignment, stream);
  used_.fetch_sub(bytes, std::memory_order_relaxed);
}

void LimitingResource::do_collect_stats(MemoryStats& stats) const {
  upstream().collect_stats(stats);
  stats.limit_bytes = static_cast<std::int64_t>(limit_);
}

}  // namespace tandem::memory
