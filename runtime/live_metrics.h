// Internal to runtime/: a worker's live metrics for tandemrun's Prometheus endpoint
// (tandemrun --metrics-port, docs/metrics.md). ProgressLogger feeds it every step; when the
// launcher gave the worker a file (TANDEM_METRICS_FILE), it rewrites that file at most twice a
// second - "name value" lines, atomically renamed - which tandemrun reads on each scrape. Without
// the variable it does nothing.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tandem::detail {

struct LiveSample {
  int64_t steps = 0;              // steps completed
  int64_t samples = 0;            // samples this rank processed, in all
  double loss = 0;                // of the last step
  double step_seconds = 0;        // of the last step
  double samples_per_second = 0;  // this rank's, over the last half second or more
  double comm_seconds = 0;        // the last step's gradient reduction: in flight during backward + waited after
  double exposed_comm_seconds = 0;  // of which waited after backward (not hidden by compute)
  std::map<std::string, uint64_t> wire_bytes;  // per codec, in all
};

class LiveMetrics {
 public:
  // The file from TANDEM_METRICS_FILE ("" : publish nothing).
  explicit LiveMetrics(std::string path);
  bool enabled() const { return !path_.empty(); }
  // Called every step with the sample so far; writes when the last write is 0.5 s old (`now`
  // in seconds, monotonic) or `force`.
  void update(const LiveSample& sample, double now, bool force = false);

 private:
  std::string path_;
  double last_write_ = -1;
  double window_start_ = -1;
  int64_t window_samples_ = 0;
  double samples_per_second_ = 0;
};

}  // namespace tandem::detail
