// Which worker failure is the cause and which the consequence, and which failures a restart cannot
// fix (shared by the single-node loop in main.cpp and the multi-node agent, elastic_agent.cpp).
//
// Pure functions over the workers' error files; thread-safety: none needed; no errors thrown.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/launch_contract.h"
#include "tools/tandemrun/launch/worker_group.h"

namespace tandem::launcher {

// A communication error (a peer died, was lost or timed out) is usually the consequence of another
// worker's failure, not a cause: the error file's kind says so (launch::is_consequence).
bool looks_secondary(const launch::ErrorReport& error);

// The root cause of one attempt among the workers that failed by themselves: the first seen
// whose error does not look secondary; `first_seen` when all do (or none says).
int root_cause_local_rank(const std::vector<Worker>& workers, int first_seen);

// Why a failure cannot succeed on a restart, or "" when a restart may help (docs/launcher.md
// "Failures a restart cannot fix"): exit code 2 (run_main's configuration error), or an error
// file whose `restartable` is false (a ConfigError, a checkpoint this run cannot resume from, a
// directory that cannot be written, a program's own error type). Never from the message's text.
std::string final_reason(const std::optional<WorkerExit>& exit,
                         const std::optional<launch::ErrorReport>& error);

}  // namespace tandem::launcher
