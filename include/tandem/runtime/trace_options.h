// Options of the timeline recorder and the metrics logger (docs/timeline.md, docs/metrics.md).
//
// Plain values: the config system (docs/config.md) fills them from the YAML file, --set overrides
// and TANDEM_* variables under the keys named beside each field; nothing here reads the
// environment itself.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct TraceOptions {
  bool enabled = false;           // trace.enabled: record spans to Chrome-trace JSON
  std::string dir = "trace";      // trace.dir: each rank writes <dir>/rank<R>.json
  bool allocator_events = false;  // trace.allocator_events: also record allocator counters
  int64_t max_events = 1000000;   // trace.max_events: events kept per process; later ones dropped
};

struct MetricsOptions {
  int64_t log_every = 20;  // metrics.log_every: steps between progress lines (0 = none)
  std::string file;        // metrics.file: JSON-lines metrics of rank 0 (empty = none)
};

}  // namespace tandem
