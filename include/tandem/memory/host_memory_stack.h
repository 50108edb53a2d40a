// HostMemoryStack: the ready-made host allocator stack
//   [TrackingResource] -> [StatisticsResource] -> CachingPool -> [LimitingResource] -> HostBackend
// owning every layer in the right order.
//
// Ownership: the stack owns every layer; destroy it only after every allocation is freed.
// Thread-safety: as its layers: every member may be called from any thread.
// Errors: construction throws ConfigError for invalid pool options; allocations throw what the
// layers throw (OutOfMemoryError, ConfigError).
#pragma once

#include <cstddef>
#include <memory>

#include <tandem/memory/caching_pool.h>
#include <tandem/memory/host_backend.h>
#include <tandem/memory/limiting_resource.h>
#include <tandem/memory/statistics_resource.h>
#include <tandem/memory/tracking_resource.h>

namespace tandem::memory {

// What goes into a HostMemoryStack.
struct HostMemoryStackOptions {
  HostBackendOptions host;
  std::size_t limit_bytes = 0;  // > 0: cap reserved memory with a LimitingResource
  CachingPoolOptions pool;
  bool statistics = true;       // StatisticsResource on top of the pool
  bool tracking = false;        // TrackingResource on top (needed for leak detection)
  TrackingOptions tracking_options;
};

// Owns the layers; top() is what callers allocate from. Not copyable or movable (layers point at
// each other). Thread-safe as its layers are. Destroy it only after every allocation is freed.
class HostMemoryStack {
 public:
  explicit HostMemoryStack(HostMemoryStackOptions options = {});
  ~HostMemoryStack();
  HostMemoryStack(const HostMemoryStack&) = delete;
  HostMemoryStack& operator=(const HostMemoryStack&) = delete;

  // The layer to allocate from.
  MemoryResource& top() { return *top_; }
  const MemoryResource& top() const { return *top_; }
  // The layers (the optional ones are nullptr when not configured).
  CachingPool& pool() { return *pool_; }
  HostBackend& backend() { return *host_; }
  LimitingResource* limiter() { return limit_.get(); }
  StatisticsResource* statistics() { return stats_.get(); }
  TrackingResource* tracking() { return track_.get(); }

  // Statistics of the whole stack.
  MemoryStats stats() const;

 private:
  std::unique_ptr<HostBackend> host_;
  std::unique_ptr<LimitingResource> limit_;
  std::unique_ptr<CachingPool> pool_;
  std::unique_ptr<StatisticsResource> stats_;
  std::unique_ptr<TrackingResource> track_;
  MemoryResource* top_ = nullptr;
};

}  // namespace tandem::memory
