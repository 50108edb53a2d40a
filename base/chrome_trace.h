// Chrome-trace JSON (the Trace Event Format that chrome://tracing and ui.perfetto.dev open): the
// one writer of tandem's timelines. The recorder's rank files (base/trace_recorder.cpp), the merged
// timeline (tools/trace-tools/trace_merge.cpp) and the pipeline simulator's export
// (runtime/pipeline/simulate.cpp) all write through it, so every file has the same shape:
//
//   {"traceEvents":[
//   <event>,
//   <event>
//   ],"displayTimeUnit":"ms","otherData":{...}}
//
// one event per line. Strings go through base/json.h (escaped, invalid UTF-8 replaced), so the
// output is valid JSON whatever the names hold. Timestamps and durations are microseconds: an
// integral value prints as an integer, any other with three decimals (nanoseconds).
//
// Ownership: the writer owns the text written so far (text()); a caller streaming a large file
// writes that out and clears it between events. Thread-safety: one writer per thread.
// Errors: finish() throws what JsonValue::dump() throws for otherData.
#pragma once

#include "base/json.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// One event. Fields a phase does not use are left out of its JSON.
struct ChromeTraceEvent {
  std::string_view name;
  std::string_view category;  // "cat"; empty: none
  char phase = 'X';           // 'X' complete, 'b'/'e' async, 'i' instant, 'C' counter
  double ts_us = 0;
  int64_t pid = 0;
  int64_t tid = 0;
  double dur_us = 0;          // 'X' only
  uint64_t id = 0;            // 'b' / 'e' only
  std::string_view args;      // the body of the args object, `"k":v,...` (trace::Args::body())
};

class ChromeTraceWriter {
 public:
  ChromeTraceWriter();  // opens the file: {"traceEvents":[

  void event(const ChromeTraceEvent& e);
  // A metadata event ("ph":"M": process_name, thread_name, process_sort_index...); `args` as above.
  void metadata(std::string_view name, int64_t pid, int64_t tid, std::string_view args);
  // An event that is already a JSON object (copied from another trace, as the merge does).
  void event(const JsonValue& e);
  // Closes the file with displayTimeUnit "ms" and `other_data` (an object).
  void finish(const JsonValue& other_data);

  // The text written so far (the whole file after finish()).
  std::string& text() { return out_; }

 private:
  void separate();
  std::string out_;
  bool first_ = true;
};

// `v` as a Chrome-trace time: an integer when integral, else three decimals.
void append_trace_time(std::string& out, double v);

}  // namespace tandem
