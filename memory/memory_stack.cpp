// MemoryStack: builds the layers bottom-up, tears them down top-down.
#include <tandem/memory/memory_stack.h>

#include <tandem/base/errors.h>

namespace tandem::memory {

MemoryStack::MemoryStack(std::unique_ptr<MemoryResource> backend, MemoryStackOptions o) : backend_(std::move(backend)) {
  if (!backend_) throw ConfigError("tandem: MemoryStack needs a backend, got null");
  MemoryResource* below = backend_.get();
  if (o.limit_bytes > 0) {
    limit_ = std::make_unique<LimitingResource>(*below, o.limit_bytes);
    below = limit_.get();
  }
  pool_ = std::make_unique<CachingPool>(*below, o.pool);
  top_ = pool_.get();
  if (o.stream_events) {
    cross_ = std::make_unique<CrossStreamResource>(*top_, o.stream_events);
    top_ = cross_.get();
  }
  if (o.statistics) {
    stats_ = std::make_unique<StatisticsResource>(*top_);
    top_ = stats_.get();
  }
  if (o.tracking) {
    track_ = std::make_unique<TrackingResource>(*top_, o.tracking_options);
    top_ = track_.get();
  }
}

MemoryStack::~MemoryStack() {
  track_.reset();
  stats_.reset();
  cross_.reset();  // waits for frees still used by other streams
  pool_.reset();
  limit_.reset();
  backend_.reset();
}

MemoryStats MemoryStack::stats() const {
  MemoryStats s;
  top_->collect_stats(s);
  return s;
}

void MemoryStack::reset_peak() {
  pool_->reset_peak();
  if (stats_) stats_->reset_peak();
}

}  // namespace tandem::memory
