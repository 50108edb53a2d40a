// MemoryStack: a ready-made allocator stack over any backend, owning every layer:
//   [TrackingResource] -> [StatisticsResource] -> [CrossStreamResource] -> CachingPool
//     -> [LimitingResource] -> backend
// HostMemoryStack is this over a HostBackend; install_cuda_allocator() builds one per GPU over a
// CudaDeviceBackend, with the stream layer.
//
// Ownership: the stack owns its backend and every layer; destroy it only after every allocation
// is freed. The StreamEvents of the options are shared.
// Thread-safety: as its layers: every member may be called from any thread.
// Errors: construction throws ConfigError for invalid pool options or a null backend; allocations
// throw what the layers throw (OutOfMemoryError, ConfigError).
#pragma once

#include <cstddef>
#include <memory>

#include <tandem/memory/caching_pool.h>
#include <tandem/memory/cross_stream_resource.h>
#include <tandem/memory/limiting_resource.h>
#include <tandem/memory/statistics_resource.h>
#include <tandem/memory/tracking_resource.h>

namespace tandem::memory {

// What goes into a MemoryStack above its backend.
struct MemoryStackOptions {
  std::size_t limit_bytes = 0;  // > 0: cap reserved memory with a LimitingResource
  CachingPoolOptions pool;
  bool statistics = true;       // StatisticsResource on top of the pool
  bool tracking = false;        // TrackingResource on top (needed for leak detection)
  TrackingOptions tracking_options;
  // Set: a CrossStreamResource above the pool, so memory used on several streams is reused only
  // after them (device memory). Null: none (host memory).
  std::shared_ptr<StreamEvents> stream_events;
};

// Owns the layers; top() is what callers allocate from. Not copyable or movable (layers point at
// each other). Thread-safe as its layers are. Destroy it only after every allocation is freed.
class MemoryStack {
 public:
  // `backend` is the bottom layer (must not be null).
  MemoryStack(std::unique_ptr<MemoryResource> backend, MemoryStackOptions options);
  virtual ~MemoryStack();
  MemoryStack(const MemoryStack&) = delete;
  MemoryStack& operator=(const MemoryStack&) = delete;

  // The layer to allocate from.
  MemoryResource& top() { return *top_; }
  const MemoryResource& top() const { return *top_; }
  // The layers (the optional ones are nullptr when not configured).
  CachingPool& pool() { return *pool_; }
  MemoryResource& backend() { return *backend_; }
  LimitingResource* limiter() { return limit_.get(); }
  CrossStreamResource* cross_stream() { return cross_.get(); }
  StatisticsResource* statistics() { return stats_.get(); }
  TrackingResource* tracking() { return track_.get(); }

  // Statistics of the whole stack.
  MemoryStats stats() const;

  // Sets the peaks of the pool and of the statistics layer to their current values.
  void reset_peak();

 private:
  std::unique_ptr<MemoryResource> backend_;
  std::unique_ptr<LimitingResource> limit_;
  std::unique_ptr<CachingPool> pool_;
  std::unique_ptr<CrossStreamResource> cross_;
  std::unique_ptr<StatisticsResource> stats_;
  std::unique_ptr<TrackingResource> track_;
  MemoryResource* top_ = nullptr;
};

}  // namespace tandem::memory
