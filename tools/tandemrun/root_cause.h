// Which worker failure is the cause and which the consequence (shared by the single-node loop in
// main.cpp and the multi-node agent, elastic_agent.cpp).
//
// Pure functions over the workers' error files; thread-safety: none needed; no errors thrown.
#pragma once

#include "tools/tandemrun/error_file.h"
#include "tools/tandemrun/worker_group.h"

namespace tandem::launcher {

// A communication error (a peer died or timed out) is usually the consequence of another worker's
// failure, not a cause: tandem's CommError / TimeoutError as run_main writes them.
bool looks_secondary(const WorkerError& error);

// The root cause of one attempt among the workers that failed by themselves: the first seen
// whose error does not look secondary; `first_seen` when all do (or none says).
int root_cause_local_rank(const std::vector<Worker>& workers, int first_seen);

}  // namespace tandem::launcher
