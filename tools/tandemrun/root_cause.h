// Which worker failure is the cause and which the consequence, and which failures a restart cannot
// fix (shared by the single-node loop in main.cpp and the multi-node agent, elastic_agent.cpp).
//
// Pure functions over the workers' error files; thread-safety: none needed; no errors thrown.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/tandemrun/error_file.h"
#include "tools/tandemrun/worker_group.h"

namespace tandem::launcher {

// A communication error (a peer died or timed out) is usually the consequence of another worker's
// failure, not a cause: tandem's CommError / TimeoutError as run_main writes them.
bool looks_secondary(const WorkerError& error);

// The root cause of one attempt among the workers that failed by themselves: the first seen
// whose error does not look secondary; `first_seen` when all do (or none says).
int root_cause_local_rank(const std::vector<Worker>& workers, int first_seen);

// Why a failure cannot succeed on a restart, or "" when a restart may help (docs/launcher.md
// "Failures a restart cannot fix"): exit code 2 (run_main's configuration error), an error of a
// ConfigError type, a checkpoint this run cannot resume from (another world size, another
// model), or a checkpoint directory that cannot be written (permissions, not a directory, a
// read-only file system).
std::string final_reason(const std::optional<WorkerExit>& exit,
                         const std::optional<WorkerError>& error);

}  // namespace tandem::launcher
