// TrackingResource: one record per live allocation (size, step, time, optional stack), grouped
// by allocation site; the data behind the leak detector, the shutdown report and the
// step/stack annotations of snapshots.
//
// Ownership: refers to its upstream (which must outlive it); owns its records, sites and timeline.
// Thread-safety: every member may be called from any thread (see TrackingResource below).
// Errors: none of its own; allocate() throws what the upstream throws, or std::bad_alloc when the
// record cannot be stored (the memory is given back first).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <tandem/memory/memory_resource.h>
#include <tandem/memory/snapshot.h>

namespace tandem::memory {

// When to capture the allocating stack (the expensive part of tracking).
enum class StackCapture {
  kNone,     // no stacks: records carry size/step/time only, all under one site
  kSampled,  // one allocation in `sample_every` per thread
  kAll,      // every allocation (debugging; see docs/memory.md for the measured cost)
};

// Tuning of a TrackingResource.
struct TrackingOptions {
  StackCapture stacks = StackCapture::kNone;
  std::uint32_t sample_every = 64;  // for kSampled
  std::size_t max_frames = 48;      // frames kept per stack (libtorch adds ~20 above user code)
  // Print live allocations grouped by site when the resource is destroyed. On by default in
  // debug builds (NDEBUG undefined where this header is compiled).
#ifdef NDEBUG
  bool report_at_exit = false;
#else
  bool report_at_exit = true;
#endif
  // Frames whose symbol or module starts with one of these are not used as a site's label.
  std::vector<std::string> internal_prefixes = default_prefixes();
  // Monotonic clock in nanoseconds (injectable for tests); default std::chrono::steady_clock.
  std::function<std::int64_t()> clock;
  // Where reports go (shutdown report); default: stderr.
  std::function<void(const std::string&)> sink;
  std::size_t timeline_capacity = 100000;  // mark_step() points kept for snapshots

  static std::vector<std::string> default_prefixes();
};

// One live allocation.
struct AllocationRecord {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::int64_t step = 0;
  std::int64_t time_ns = 0;
  std::uint64_t site = 0;  // 0: no stack captured
};

// Live allocations of one site.
struct SiteSummary {
  SiteInfo site;
  std::int64_t live_bytes = 0;
  std::int64_t live_count = 0;
  std::int64_t oldest_step = 0;
};

// Live bytes of one site at a point in time (cheap, no symbolisation).
struct SiteLive {
  std::uint64_t site = 0;
  std::int64_t live_bytes = 0;
  std::int64_t live_count = 0;
};

// Records every allocation passing through it. Thread-safe: records live in 64 shards, each with
// its own mutex (no global lock on the allocation path); the site table takes a mutex only when
// a stack was captured.
class TrackingResource final : public AdaptorResource {
 public:
  explicit TrackingResource(MemoryResource& upstream, TrackingOptions options = {});
  ~TrackingResource() override;

  // Starts the next training step: records allocated from now on carry the new step number,
  // and a timeline point (live and reserved bytes) is appended. Returns the new step.
  // Thread-safe.
  std::int64_t mark_step();

  // The current step (0 before the first mark_step()). Thread-safe.
  std::int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // Every live allocation. Thread-safe; O(live allocations).
  std::vector<AllocationRecord> live_allocations() const;

  // Live bytes/counts per site (sites with nothing live included once seen). Thread-safe.
  std::vector<SiteLive> live_by_site_fast() const;

  // Live allocations grouped by site, largest first, with symbolised stacks. Thread-safe.
  std::vector<SiteSummary> live_by_site() const;

  // Site `id` with its symbolised stack and label. Thread-safe.
  SiteInfo site_info(std::uint64_t id) const;

  // Human-readable report of live allocations by site (at most `max_sites` sites). Thread-safe.
  std::string format_live_report(std::size_t max_sites = 20) const;

  // Total live bytes tracked. Thread-safe.
  std::int64_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }

  // Sets whether the shutdown report is printed (overrides TrackingOptions::report_at_exit).
  void set_report_at_exit(bool on) { report_at_exit_.store(on); }

  // The options in use.
  const TrackingOptions& options() const { return options_; }

 private:
  struct Site;
  struct Record {
    std::size_t size;
    std::int64_t step;
    std::int64_t time_ns;
    Site* site;
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<void*, Record> records;
  };

  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept override;
  void do_collect_snapshot(Snapshot& snapshot) const override;
  Site* site_for_current_stack();
  Shard& shard_for(const void* p) const;
  std::int64_t now() const;

  TrackingOptions options_;
  static constexpr std::size_t kShards = 64;
  std::unique_ptr<Shard[]> shards_;
  mutable std::mutex sites_mu_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Site>> sites_;
  Site* no_stack_site_ = nullptr;
  std::atomic<std::int64_t> step_{0};
  std::atomic<std::int64_t> live_bytes_{0};
  std::atomic<bool> report_at_exit_{false};
  mutable std::mutex timeline_mu_;
  std::vector<TimelinePoint> timeline_;
};

}  // namespace tandem::memory
