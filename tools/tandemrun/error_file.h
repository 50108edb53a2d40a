// Reading a worker's TORCHELASTIC_ERROR_FILE (TorchElastic's JSON error-file format):
//
//   {"message": {"message": "<Type>: <what>",
//                "extraInfo": {"py_callstack": "<trace>", "timestamp": "<unix seconds>"}}}
//
// (also the older flat form {"message": "<text>", "timestamp": <unix seconds>}). Written by
// tandem::run_main() (C++ workers) or torch's @record (Python workers); tandemrun reads it to show
// the root cause of a failure.
#pragma once

#include <optional>
#include <string>

namespace tandem::launcher {

struct WorkerError {
  std::string message;    // "<Type>: <what>"
  std::string callstack;  // extraInfo.py_callstack (may be empty)
  long long timestamp = 0;
};

// Parses the text of an error file with the project's strict JSON reader (base/json.h).
// Returns nullopt when it is not valid JSON or has no message.
std::optional<WorkerError> parse_error_file(const std::string& text);

// Reads and parses `path`; nullopt when the file is missing, unreadable (more than 1 MiB is
// truncated and then fails to parse) or malformed.
std::optional<WorkerError> read_error_file(const std::string& path);

}  // namespace tandem::launcher
