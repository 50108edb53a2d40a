// Argument checks shared by every MemoryResource.
#include <tandem/memory/memory_resource.h>

#include <tandem/base/errors.h>

namespace tandem::memory {

void* MemoryResource::allocate(std::size_t bytes, std::size_t alignment, StreamId stream) {
  if (alignment == 0) alignment = kDefaultAlignment;
  if (!is_pow2(alignment))
    throw ConfigError("tandem: allocate(" + std::to_string(bytes) + ", alignment " + std::to_string(alignment) +
                      "): alignment must be a power of two");
  if (bytes == 0) return nullptr;
  return do_allocate(bytes, alignment, stream);
}

void MemoryResource::deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept {
  if (p == nullptr) return;
  if (alignment == 0) alignment = kDefaultAlignment;
  do_deallocate(p, bytes, alignment, stream);
}

}  // namespace tandem::memory
