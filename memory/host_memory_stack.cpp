// HostMemoryStack: builds the layers bottom-up.
#include <tandem/memory/host_memory_stack.h>

namespace tandem::memory {

HostMemoryStack::HostMemoryStack(HostMemoryStackOptions o) {
  host_ = std::make_unique<HostBackend>(o.host);
  MemoryResource* below = host_.get();
  if (o.limit_bytes > 0) {
    limit_ = std::make_unique<LimitingResource>(*below, o.limit_bytes);
    below = limit_.get();
  }
  pool_ = std::make_unique<CachingPool>(*below, o.pool);
  top_ = pool_.get();
  if (o.statistics) {
    stats_ = std::make_unique<StatisticsResource>(*top_);
    top_ = stats_.get();
  }
  if (o.tracking) {
    track_ = std::make_unique<TrackingResource>(*top_, o.tracking_options);
    top_ = track_.get();
  }
}

HostMemoryStack::~HostMemoryStack() {
  track_.reset();
  stats_.reset();
  pool_.reset();
  limit_.reset();
  host_.reset();
}

MemoryStats HostMemoryStack::stats() const {
  MemoryStats s;
  top_->collect_stats(s);
  return s;
}

}  // namespace tandem::memory
