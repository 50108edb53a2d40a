// Merging the ranks' Chrome-trace files into one timeline (tandem-trace merge, tandemrun
// --trace-dir). Torch-free: tandemrun links it.
//
// Every rank's file (<dir>/rank<R>.json, written by tandem::trace::stop()) is parsed strictly,
// its events get pid = R, and all timestamps are shifted by the earliest one, so the merged file
// starts at 0 and ranks line up on the wall clock. Metadata events (process and thread names) are
// kept; each rank's "otherData" (recorded/dropped counts) is kept under otherData.ranks.
//
// Errors: tandem::Error naming the file and what is wrong (missing, not JSON, no traceEvents);
// reading and writing files: what base's FileSystem throws (the operation, the path, the OS error).
// Thread-safety: pure functions.
#pragma once

#include "base/json.h"

#include <string>
#include <utility>
#include <vector>

namespace tandem::trace {

struct RankTrace {
  int rank = 0;
  std::string source;  // file name, for messages
  std::string text;    // the file's JSON
};

// The rank*.json files in `dir`, sorted by rank. Throws Error when there are none.
std::vector<RankTrace> read_rank_traces(const std::string& dir);

// The merged timeline as JSON (an object with traceEvents, displayTimeUnit, otherData).
JsonValue merge_traces(const std::vector<RankTrace>& ranks);

// Reads `dir`, merges, writes `out_path` (via a temporary file and rename). Returns the merged
// value (for the summary).
JsonValue merge_trace_dir(const std::string& dir, const std::string& out_path);

// Parses a timeline file (merged or a single rank's). Throws Error naming `path`.
JsonValue read_trace_file(const std::string& path);

// Replaces `path` with `text` atomically (FileSystem::write_file_atomically: a temporary file,
// fsync, rename). Throws what FileSystem throws (an Error naming the operation and the path).
void write_text_file(const std::string& path, const std::string& text);

// A timeline value (merged or a rank's) as Chrome-trace text (base/chrome_trace.h): one event per
// line.
std::string trace_text(const JsonValue& trace);

}  // namespace tandem::trace
