// ProgressLogger (include/tandem/runtime/metrics.h).
#include <tandem/base/errors.h>
#include <tandem/base/trace.h>
#include <tandem/memory/cpu_allocator.h>
#include <tandem/memory/memory_resource.h>
#include <tandem/memory/memory_stats.h>
#include <tandem/runtime/metrics.h>
#include <tandem/runtime/reducer.h>

#include "base/json.h"
#include "base/launch_contract.h"
#include "runtime/live_metrics.h"

#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace tandem {

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t default_peak_bytes() {
  if (memory::MemoryResource* r = memory::installed_cpu_resource()) {
    memory::MemoryStats s;
    r->collect_stats(s);
    if (s.allocated_bytes.peak > 0) return s.allocated_bytes.peak;
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// A number for JSON: integral values print as integers ("16", not "16.0"), others in their
// shortest round-trip form, NaN/Inf as null.
JsonValue json_number(double v) {
  if (!std::isfinite(v)) return JsonValue();
  if (std::trunc(v) == v && std::fabs(v) < 9.0e15) return JsonValue(static_cast<int64_t>(v));
  return JsonValue(v);
}

}  // namespace

ProgressLogger::ProgressLogger(MetricsOptions options, int64_t total_steps, int rank, int world,
                               ProgressSources sources, std::ostream* out)
    : options_(std::move(options)),
      total_steps_(total_steps),
      rank_(rank),
      world_(world < 1 ? 1 : world),
      sources_(std::move(sources)),
      out_(out != nullptr ? out : &std::cout) {
  if (options_.log_every < 0) {
    throw ConfigError("tandem: metrics.log_every must be >= 0 (0 turns the progress line off); "
                      "got " + std::to_string(options_.log_every) + ".");
  }
  if (!sources_.clock) sources_.clock = steady_seconds;
  if (!sources_.peak_bytes) sources_.peak_bytes = default_peak_bytes;
  if (rank_ == 0 && !options_.file.empty()) {
    file_ = std::fopen(options_.file.c_str(), "a");
    if (file_ == nullptr) {
      throw ConfigError("tandem: cannot open metrics.file '" + options_.file +
                        "' for appending (" + std::strerror(errno) +
                        "); set metrics.file to a writable path, or empty to write none.");
    }
  }
  start_s_ = window_start_s_ = last_step_s_ = sources_.clock();
  live_ = std::make_unique<detail::LiveMetrics>(launch::env(launch::kEnvMetricsFile).value_or(""));
  live_sample_ = std::make_unique<detail::LiveSample>();
}

ProgressLogger::~ProgressLogger() {
  if (file_ != nullptr) std::fclose(file_);
}

void ProgressLogger::track_overlap(const Reducer& reducer) {
  const Reducer* r = &reducer;
  reducer_ = r;
  sources_.reduction = [r]() -> std::optional<ReductionTimes> {
    return ReductionTimes{r->last_overlap_seconds(), r->last_wait_seconds()};
  };
}

void ProgressLogger::publish_live(int64_t step, double loss, int64_t samples,
                                  const std::optional<ReductionTimes>& reduction) {
  if (!live_->enabled()) return;
  const double now = sources_.clock();
  detail::LiveSample& s = *live_sample_;
  s.steps = step;
  s.samples += samples;
  s.loss = loss;
  s.step_seconds = now - last_step_s_;
  if (reduction) {
    s.comm_seconds = reduction->hidden_s + reduction->waited_s;
    s.exposed_comm_seconds = reduction->waited_s;
  }
  if (reducer_ != nullptr) {
    s.wire_bytes[reducer_->codec().name()] += reducer_->codec().bytes_sent_last_step();
  }
  live_->update(s, now, total_steps_ > 0 && step == total_steps_);
  last_step_s_ = now;
}

std::optional<ProgressRecord> ProgressLogger::step(int64_t step, double loss, int64_t samples) {
  memory::sample_allocator_counter();
  window_samples_ += samples;
  window_steps_ += 1;
  const std::optional<ReductionTimes> reduction =
      sources_.reduction ? sources_.reduction() : std::nullopt;
  if (reduction) {
    window_reduction_.hidden_s += reduction->hidden_s;
    window_reduction_.waited_s += reduction->waited_s;
  }
  publish_live(step, loss, samples, reduction);
  if (rank_ != 0) return std::nullopt;
  const bool due = (options_.log_every > 0 && step % options_.log_every == 0) ||
                   (total_steps_ > 0 && step == total_steps_ && options_.log_every > 0);
  if (!due) return std::nullopt;
  const double now = sources_.clock();
  const double window = now - window_start_s_;
  ProgressRecord r;
  r.step = step;
  r.total_steps = total_steps_;
  r.loss = loss;
  r.elapsed_s = now - start_s_;
  r.samples_per_s = window > 0 ? static_cast<double>(window_samples_) * world_ / window : 0;
  if (total_steps_ > 0 && window_steps_ > 0) {
    const int64_t left = total_steps_ > step ? total_steps_ - step : 0;
    r.eta_s = window / static_cast<double>(window_steps_) * static_cast<double>(left);
  }
  r.peak_bytes = sources_.peak_bytes();
  const double reduction_s = window_reduction_.hidden_s + window_reduction_.waited_s;
  if (reduction_s > 0) r.hidden = window_reduction_.hidden_s / reduction_s;
  window_start_s_ = now;
  window_samples_ = 0;
  window_steps_ = 0;
  window_reduction_ = {};
  *out_ << format_line(r) << std::endl;
  if (file_ != nullptr) {
    const std::string line = format_json(r) + "\n";
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);  // plots may read the file while training runs
  }
  if (trace::enabled()) {
    trace::counter("train", trace::Args().add("loss", loss).add("samples_per_s", r.samples_per_s));
  }
  return r;
}

std::string ProgressLogger::format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const int64_t s = std::llround(seconds);
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

std::string ProgressLogger::format_line(const ProgressRecord& r) {
  std::string line = "step " + std::to_string(r.step);
  if (r.total_steps > 0) line += "/" + std::to_string(r.total_steps);
  line += " loss " + fixed(r.loss, 4) + " " + fixed(r.samples_per_s, 0) + " samples/s";
  if (r.eta_s) line += " ETA " + format_duration(*r.eta_s);
  line += " peak " + fixed(static_cast<double>(r.peak_bytes) / (1024.0 * 1024.0), 0) + " MiB";
  if (r.hidden) line += " hidden " + fixed(100.0 * *r.hidden, 0) + "%";
  return line;
}

std::string ProgressLogger::format_json(const ProgressRecord& r) {
  JsonValue j = JsonValue::object();  // keys in the documented order
  j.set("step", JsonValue(static_cast<int64_t>(r.step)));
  if (r.total_steps > 0) j.set("total_steps", JsonValue(static_cast<int64_t>(r.total_steps)));
  j.set("loss", json_number(r.loss));
  j.set("samples_per_s", json_number(r.samples_per_s));
  j.set("elapsed_s", json_number(r.elapsed_s));
  if (r.eta_s) j.set("eta_s", json_number(*r.eta_s));
  j.set("peak_bytes", JsonValue(static_cast<int64_t>(r.peak_bytes)));
  if (r.hidden) j.set("hidden", json_number(*r.hidden));
  return j.dump();
}

}  // namespace tandem
