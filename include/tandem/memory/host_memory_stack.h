// HostMemoryStack: the ready-made host allocator stack
//   [TrackingResource] -> [StatisticsResource] -> CachingPool -> [LimitingResource] -> HostBackend
// owning every layer in the right order (a MemoryStack over a HostBackend).
//
// Ownership: the stack owns every layer; destroy it only after every allocation is freed.
// Thread-safety: as its layers: every member may be called from any thread.
// Errors: construction throws ConfigError for invalid pool options; allocations throw what the
// layers throw (OutOfMemoryError, ConfigError).
#pragma once

#include <tandem/memory/host_backend.h>
#include <tandem/memory/memory_stack.h>

namespace tandem::memory {

// What goes into a HostMemoryStack: the layers (MemoryStackOptions) and the host backend.
struct HostMemoryStackOptions : MemoryStackOptions {
  HostBackendOptions host;
};

// A MemoryStack over a HostBackend. Not copyable or movable. Thread-safe as its layers are.
// Destroy it only after every allocation is freed.
class HostMemoryStack final : public MemoryStack {
 public:
  explicit HostMemoryStack(HostMemoryStackOptions options = {});

  // The bottom layer.
  HostBackend& backend() { return *host_; }

 private:
  HostBackend* host_;
};

}  // namespace tandem::memory
