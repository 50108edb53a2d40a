// Training progress: a one-line report every metrics.log_every steps and a JSON-lines file for
// plotting (docs/metrics.md).
//
//   tandem::ProgressLogger logger(options.metrics, total_steps, rank, world);
//   logger.track_overlap(ddp.reducer());                 // optional
//   for (int64_t step = 1; step <= total_steps; ++step) { ...; logger.step(step, loss, batch); }
//
// prints on rank 0, e.g.
//   step 120/1000 loss 0.4312 1834 samples/s ETA 2m31s peak 212 MiB hidden 71%
// `step` is the number of steps done (1-based); `samples` is what this rank processed in that
// step; samples/s is global (times `world`), measured since the previous line; ETA extrapolates
// that pace. Peak memory is the installed tandem CPU allocator's allocated-bytes high-water mark
// when one is installed (memory/cpu_allocator.h), else the process's maximum RSS. Overlap: of the
// time the gradient reduction took in the steps since the previous line, the share that ran while
// backward was still computing (sum of hidden / sum of hidden + waited after backward): the same
// "hidden" share as the timeline summary's (docs/timeline.md), for the gradient reduction only.
// Other ranks print and write nothing. Under tandemrun --metrics-port every rank also publishes
// live metrics for tandemrun's Prometheus endpoint (docs/metrics.md), at most twice a second.
//
// Determinism: the text and the JSON depend only on the arguments and the injected sources
// (clock, peak memory, overlap), so tests pin them.
// Ownership: the logger owns its metrics file (rank 0; closed by the destructor); track_overlap()
// keeps a pointer to the Reducer, which must outlive the logger. Thread-safety: one training
// thread.
// Errors: the constructor throws ConfigError when metrics.file cannot be opened for appending,
// or log_every < 0.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

namespace tandem {

// Plain values the config system fills (docs/config.md).
struct MetricsOptions {
  int64_t log_every = 20;  // metrics.log_every: steps between progress lines (0 = none)
  std::string file;        // metrics.file: JSON-lines metrics of rank 0 (empty = none)
};

class Reducer;
namespace detail {
class LiveMetrics;
struct LiveSample;
}  // namespace detail

// One step's gradient reduction: seconds it ran while backward computed, and seconds waited for
// it after backward.
struct ReductionTimes {
  double hidden_s = 0;
  double waited_s = 0;
};

struct ProgressSources {
  std::function<double()> clock;         // seconds, monotonic; default: steady_clock
  std::function<int64_t()> peak_bytes;   // default: allocator peak, else max RSS
  // The last step's reduction, read after every step; default: none (no "hidden" printed).
  std::function<std::optional<ReductionTimes>()> reduction;
};

// One logged step, as printed and written.
struct ProgressRecord {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double samples_per_s = 0;
  double elapsed_s = 0;
  std::optional<double> eta_s;  // unknown without total_steps
  int64_t peak_bytes = 0;
  // The share of the gradient reduction that ran behind backward (the timeline summary's "hidden").
  std::optional<double> hidden;
};

class ProgressLogger {
 public:
  ProgressLogger(MetricsOptions options, int64_t total_steps, int rank, int world,
                 ProgressSources sources = {}, std::ostream* out = nullptr /* std::cout */);
  ~ProgressLogger();
  ProgressLogger(const ProgressLogger&) = delete;
  ProgressLogger& operator=(const ProgressLogger&) = delete;

  // Call once per step. Returns the record when this step was logged (on rank 0).
  std::optional<ProgressRecord> step(int64_t step, double loss, int64_t samples);

  // Overlap from a DistributedDataParallel's reducer (reducer.last_overlap_seconds()/wait, each
  // step). The reducer must outlive the logger.
  void track_overlap(const Reducer& reducer);

  static std::string format_line(const ProgressRecord& r);
  static std::string format_json(const ProgressRecord& r);
  // "45s", "2m31s", "1h02m".
  static std::string format_duration(double seconds);

 private:
  void publish_live(int64_t step, double loss, int64_t samples,
                    const std::optional<ReductionTimes>& reduction);
  MetricsOptions options_;
  int64_t total_steps_;
  int rank_;
  int world_;
  ProgressSources sources_;
  std::ostream* out_;
  std::FILE* file_ = nullptr;
  double start_s_ = 0;
  double window_start_s_ = 0;
  int64_t window_samples_ = 0;
  int64_t window_steps_ = 0;
  ReductionTimes window_reduction_;  // summed over the steps since the last line
  // Live metrics (every rank; a no-op unless tandemrun asked for them).
  const Reducer* reducer_ = nullptr;
  std::unique_ptr<detail::LiveMetrics> live_;
  std::unique_ptr<detail::LiveSample> live_sample_;
  double last_step_s_ = 0;
};

}  // namespace tandem
