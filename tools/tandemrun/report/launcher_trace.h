// tandemrun --trace-dir: what the launcher does around a traced run. Torch-free.
//
// Before the launch, prepare_trace_dir() creates DIR, removes rank*.json and timeline.json left
// by an earlier run (so they cannot be merged by mistake) and sets TANDEM_TRACE_DIR=DIR in the
// workers' environment (the config system maps it to trace.enabled=true, trace.dir=DIR). After
// the run, report_trace_dir() merges DIR/rank*.json into DIR/timeline.json and prints the summary
// to stderr. Neither changes tandemrun's exit status: problems are printed, not thrown.
#pragma once

#include <string>
#include <vector>

namespace tandem::trace {

// Returns false (after printing why) when DIR cannot be created.
bool prepare_trace_dir(const std::string& dir, std::vector<std::string>& env);

// Returns true when DIR/timeline.json was written.
bool report_trace_dir(const std::string& dir);

}  // namespace tandem::trace
