// CrossStreamResource: device memory used on more than one stream goes back to the pool only
// after the work those other streams queued on it is done (libtorch's recordStream contract).
//
// A CachingPool reuses a freed block only for allocations on the stream it was allocated on:
// work queued later on that stream runs after everything queued before the free. A block that
// another stream also reads or writes is not covered by that order. record_stream(p, s) notes
// such a use; when p is freed, an event is recorded on each noted stream and the block reaches
// the pool only once every event has completed (polled on each allocation; waited for before
// an out-of-memory error and on release_cached()). Streams and events are abstract
// (StreamEvents), so the policy is tested on the host with a simulated clock of events; CUDA
// supplies cudaEvent_t (libtandem_cuda).
//
// Ownership: refers to its upstream (which must outlive it); shares the StreamEvents; owns its
// records of recorded streams and pending frees.
// Thread-safety: every member may be called from any thread (one mutex, taken on a free only
// when some allocation has a recorded stream, on an allocation only when frees are pending).
// Errors: allocate() throws what the upstream throws (after waiting for pending frees and
// retrying once on OutOfMemoryError); record_stream() throws std::bad_alloc only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <tandem/memory/memory_resource.h>

namespace tandem::memory {

// Marks points in the work queued on streams. Implementations: CUDA events (libtandem_cuda);
// a simulation in the tests. Every member must be thread-safe and must not throw.
class StreamEvents {
 public:
  using Event = void*;
  virtual ~StreamEvents() = default;

  // Marks the work queued on `stream` so far. Returns nullptr when that work is known to be done
  // (an implementation that cannot record an event waits for the stream instead).
  virtual Event record(StreamId stream) noexcept = 0;
  // True once the work marked by `event` is done. An error counts as done (reported once).
  virtual bool ready(Event event) noexcept = 0;
  // Blocks the calling thread until the work marked by `event` is done.
  virtual void wait(Event event) noexcept = 0;
  // Gives `event` back for reuse; it is not used again.
  virtual void release(Event event) noexcept = 0;
};

// See the header comment. Thread-safe.
class CrossStreamResource final : public AdaptorResource {
 public:
  // `events` must not be null.
  CrossStreamResource(MemoryResource& upstream, std::shared_ptr<StreamEvents> events);
  // Waits for every pending free and returns it upstream.
  ~CrossStreamResource() override;

  // Notes that work on `stream` uses the live allocation at `p` (obtained from this resource).
  // When p is freed, the block waits for the work `stream` has queued by then. The allocation's
  // own stream needs no note (it is ignored at the free). Thread-safe.
  void record_stream(void* p, StreamId stream);

  // Returns to the upstream every pending free whose events have all completed; returns how
  // many. Called by allocate(); public for tests and idle-time housekeeping. Thread-safe.
  std::size_t process_ready();

  // Waits for every pending free's events and returns them all upstream; returns how many.
  // Thread-safe (blocks the caller until the device is done with them).
  std::size_t wait_pending();

  // Frees waiting for another stream, and their bytes. Thread-safe.
  std::size_t pending_frees() const { return pending_count_.load(std::memory_order_acquire); }
  std::int64_t pending_bytes() const { return pending_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Pending {
    void* p;
    std::size_t bytes;
    std::size_t alignment;
    StreamId stream;
    std::vector<StreamEvents::Event> events;
  };

  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept override;
  std::size_t do_release_cached() override;
  void finish(Pending& f) noexcept;  // releases the events, frees upstream

  std::shared_ptr<StreamEvents> events_;
  mutable std::mutex mu_;
  std::unordered_map<void*, std::vector<StreamId>> recorded_;  // live allocations used elsewhere
  std::vector<Pending> pending_;
  std::atomic<std::size_t> recorded_count_{0}, pending_count_{0};
  std::atomic<std::int64_t> pending_bytes_{0};
};

}  // namespace tandem::memory
