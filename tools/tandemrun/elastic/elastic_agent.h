// tandemrun's multi-node agent (--nnodes MIN:MAX with MAX > 1; docs/launcher.md "Multi-node").
//
// What: rendezvous with the other agents (rendezvous.h), run this node's workers for each round,
// restart them whenever any node's workers fail or a node is lost, until the job succeeds, the
// shared --max-restarts is used up, or too few nodes remain. Ownership: owns the rendezvous and
// the worker group for the whole run. Thread-safety: call from the main thread only (workers are
// forked from it; the rendezvous runs a keep-alive thread). Errors: returns the exit status;
// rendezvous and launch errors are logged with what to do.
#pragma once

#include <string>
#include <vector>

#include "tools/tandemrun/launch/launcher_options.h"

namespace tandem::launcher {

// Runs the job on this node. Exit status as tandemrun's: 0 the job succeeded (also when it
// finished while this node waited to be admitted), 1 it failed (the summary names the root
// cause: a worker and its node, or a lost node), 2 no job token, 128+N stopped by signal N.
int run_elastic_agent(LauncherOptions options, std::vector<std::string> env);

}  // namespace tandem::launcher
