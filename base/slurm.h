// Slurm's compact host and task lists, parsed without calling `scontrol`.
//
// Used by tandemrun (Slurm defaults for --nnodes/--master-addr/...) and by DistEnv (a worker
// started directly by `srun`). Pure functions over strings, no torch, no I/O.
//
// Errors: tandem::ConfigError naming the variable text and what is wrong (unbalanced brackets, a
// range that runs backwards, more than 1,000,000 hosts). Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

namespace tandem::slurm {

// Expands a node list such as "node[01-03,07],gpu5" into {"node01","node02","node03","node07",
// "gpu5"}. Zero padding of a range's first number is kept; several bracket groups in one name
// ("r[1-2]n[1-2]") expand as a product, in Slurm's order.
std::vector<std::string> expand_nodelist(const std::string& nodelist);

// The first host of a node list (the conventional rendezvous host), without expanding the rest.
std::string first_host(const std::string& nodelist);

// Tasks on node `node_index` from SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE syntax, e.g.
// "2(x3),1": nodes 0-2 run 2 tasks, node 3 runs 1.
int tasks_on_node(const std::string& tasks_per_node, int node_index);

}  // namespace tandem::slurm
