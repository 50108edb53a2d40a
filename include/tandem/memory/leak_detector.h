// LeakDetector: finds allocation sites whose live bytes grow steadily across training steps.
//
// Ownership: the detector refers to its TrackingResource, which must outlive it; reports are
// values.
// Thread-safety: mark_step() and reports() may be called from any thread (serialised by a mutex).
// Errors: none of its own; the on_leak callback runs inside mark_step() and what it throws
// propagates from there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <tandem/memory/snapshot.h>
#include <tandem/memory/tracking_resource.h>

namespace tandem::memory {

// One site found leaking.
struct LeakReport {
  SiteInfo site;                      // symbolised stack; label = first frame of user code
  std::int64_t step = 0;              // step at which it was detected
  std::int64_t window = 0;            // steps looked at
  std::int64_t bytes_per_step = 0;    // average growth over the window
  std::int64_t live_bytes = 0;        // live bytes of the site now
  std::int64_t live_count = 0;        // live allocations of the site now
  std::string message;                // "site X gained 64.0 KiB per step for 20 steps, live ..."
};

// Tuning of a LeakDetector.
struct LeakDetectorOptions {
  std::size_t window = 20;                 // steps a site must grow over
  double min_growing_fraction = 0.8;       // of step-to-step changes that must be increases
  std::int64_t min_bytes_per_step = 1024;  // smaller average growth is ignored
  // Called for each new report (default: message printed to stderr). Runs in mark_step().
  std::function<void(const LeakReport&)> on_leak;
};

// Watches a TrackingResource. Call mark_step() once per training step (it also advances the
// tracker's step). A site is reported once, when over the last `window` steps its live bytes rose
// in at least min_growing_fraction of the steps, fell in total by at most half of what they rose,
// and grew by at least min_bytes_per_step on average. Memory that is allocated once and kept (weights,
// optimizer state) or reused each step (caches, activations freed by the end of the step) does
// not grow and is never reported. Thread-safe (mark_step() is serialised by a mutex).
class LeakDetector {
 public:
  explicit LeakDetector(TrackingResource& tracker, LeakDetectorOptions options = {});

  // Ends the current step: samples live bytes per site and returns the sites newly found leaking.
  std::vector<LeakReport> mark_step();

  // Every report so far.
  std::vector<LeakReport> reports() const;

 private:
  TrackingResource& tracker_;
  LeakDetectorOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::uint64_t, std::deque<std::int64_t>> history_;
  std::unordered_set<std::uint64_t> reported_;
  std::vector<LeakReport> reports_;
};

}  // namespace tandem::memory
