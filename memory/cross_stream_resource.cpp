// CrossStreamResource: recorded streams, event-guarded frees, polling and waiting.
#include <tandem/memory/cross_stream_resource.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include <tandem/base/errors.h>

namespace tandem::memory {

CrossStreamResource::CrossStreamResource(MemoryResource& upstream, std::shared_ptr<StreamEvents> events)
    : AdaptorResource(upstream), events_(std::move(events)) {
  if (!events_) throw ConfigError("tandem: CrossStreamResource needs a StreamEvents implementation, got null");
}

CrossStreamResource::~CrossStreamResource() { wait_pending(); }

void CrossStreamResource::record_stream(void* p, StreamId stream) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& streams = recorded_[p];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  recorded_count_.store(recorded_.size(), std::memory_order_release);
}

void CrossStreamResource::finish(Pending& f) noexcept {
  for (StreamEvents::Event e : f.events) events_->release(e);
  upstream().deallocate(f.p, f.bytes, f.alignment, f.stream);
  pending_bytes_.fetch_sub(static_cast<std::int64_t>(f.bytes), std::memory_order_relaxed);
}

std::size_t CrossStreamResource::process_ready() {
  if (pending_count_.load(std::memory_order_acquire) == 0) return 0;  // the common case: no lock
  std::vector<Pending> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto ready = [this](const Pending& f) {
      return std::all_of(f.events.begin(), f.events.end(), [this](StreamEvents::Event e) { return events_->ready(e); });
    };
    auto split = std::stable_partition(pending_.begin(), pending_.end(), [&](const Pending& f) { return !ready(f); });
    done.assign(std::make_move_iterator(split), std::make_move_iterator(pending_.end()));
    pending_.erase(split, pending_.end());
    pending_count_.store(pending_.size(), std::memory_order_release);
  }
  // Outside the lock: the pool below takes its own.
  for (Pending& f : done) finish(f);
  return done.size();
}

std::size_t CrossStreamResource::wait_pending() {
  std::vector<Pending> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(pending_);
    pending_count_.store(0, std::memory_order_release);
  }
  for (Pending& f : all) {
    for (StreamEvents::Event e : f.events) events_->wait(e);
    finish(f);
  }
  return all.size();
}

void* CrossStreamResource::do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) {
  process_ready();
  try {
    return upstream().allocate(bytes, alignment, stream);
  } catch (const OutOfMemoryError&) {
    // Blocks still read by other streams may be all that is missing: wait for them, retry once.
    if (wait_pending() == 0) throw;
  }
  return upstream().allocate(bytes, alignment, stream);
}

void CrossStreamResource::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept {
  std::vector<StreamId> streams;
  if (recorded_count_.load(std::memory_order_acquire) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = recorded_.find(p);
    if (it != recorded_.end()) {
      streams = std::move(it->second);
      recorded_.erase(it);
      recorded_count_.store(recorded_.size(), std::memory_order_release);
    }
  }
  // Work on the allocation's own stream is ordered before the block's next use there.
  streams.erase(std::remove(streams.begin(), streams.end(), stream), streams.end());
  if (streams.empty()) {
    upstream().deallocate(p, bytes, alignment, stream);
    return;
  }
  Pending f{p, bytes, alignment, stream, {}};
  try {
    for (StreamId s : streams)
      if (StreamEvents::Event e = events_->record(s)) f.events.push_back(e);
    if (!f.events.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(std::move(f));
      pending_count_.store(pending_.size(), std::memory_order_release);
      pending_bytes_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
      return;
    }
  } catch (const std::exception& e) {  // out of memory for the bookkeeping: wait instead
    std::fprintf(stderr, "tandem: CrossStreamResource: %s; waiting for the streams of %p before freeing it\n",
                 e.what(), p);
    for (StreamEvents::Event ev : f.events) events_->wait(ev);
  }
  pending_bytes_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);  // finish() subtracts
  finish(f);
}

std::size_t CrossStreamResource::do_release_cached() {
  wait_pending();  // as torch.cuda.empty_cache(): blocks still in use elsewhere cannot be released
  return upstream().release_cached();
}

}  // namespace tandem::memory
