// A worker's live metrics for tandemrun's endpoint (runtime/live_metrics.h).
#include "runtime/live_metrics.h"

#include <tandem/base/file_system.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/memory/cpu_allocator.h>
#include <tandem/memory/memory_resource.h>
#include <tandem/memory/memory_stats.h>

#include <cstdio>
#include <string>

namespace tandem::detail {

namespace {

std::string line(const std::string& name, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  return name + buf;
}

}  // namespace

LiveMetrics::LiveMetrics(std::string path) : path_(std::move(path)) {}

void LiveMetrics::update(const LiveSample& s, double now, bool force) {
  if (path_.empty()) return;
  if (window_start_ < 0) {
    window_start_ = now;
    window_samples_ = s.samples;
  }
  if (!force && last_write_ >= 0 && now - last_write_ < 0.5) return;
  if (now > window_start_) {
    samples_per_second_ = static_cast<double>(s.samples - window_samples_) / (now - window_start_);
    window_start_ = now;
    window_samples_ = s.samples;
  }
  last_write_ = now;
  std::string text;
  text += line("steps", static_cast<double>(s.steps));
  text += line("samples", static_cast<double>(s.samples));
  text += line("loss", s.loss);
  text += line("step_seconds", s.step_seconds);
  text += line("samples_per_second", samples_per_second_);
  text += line("comm_seconds", s.comm_seconds);
  text += line("exposed_comm_seconds", s.exposed_comm_seconds);
  for (const auto& [codec, bytes] : s.wire_bytes) text += line("wire_bytes{codec=\"" + codec + "\"}", static_cast<double>(bytes));
  if (memory::MemoryResource* r = memory::installed_cpu_resource()) {
    memory::MemoryStats st;
    r->collect_stats(st);
    text += line("allocator_allocated_bytes", static_cast<double>(st.allocated_bytes.current));
    text += line("allocator_reserved_bytes", static_cast<double>(st.reserved_bytes.current));
    text += line("allocator_peak_bytes", static_cast<double>(st.allocated_bytes.peak));
  }
  if (const double t = last_checkpoint_commit_time(); t > 0) text += line("checkpoint_time", t);
  try {
    posix_file_system()->write_file_atomically(path_, text);
  } catch (const std::exception&) {
    // Live metrics are best effort: a full /dev/shm must not stop training.
  }
}

}  // namespace tandem::detail
