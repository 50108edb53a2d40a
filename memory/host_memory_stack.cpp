// HostMemoryStack: a MemoryStack over a HostBackend.
#include <tandem/memory/host_memory_stack.h>

namespace tandem::memory {

HostMemoryStack::HostMemoryStack(HostMemoryStackOptions o)
    : MemoryStack(std::make_unique<HostBackend>(o.host), o),
      host_(&static_cast<HostBackend&>(MemoryStack::backend())) {}

}  // namespace tandem::memory
