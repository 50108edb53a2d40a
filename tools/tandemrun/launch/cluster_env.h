// Launch defaults from the cluster a tandemrun runs in: Slurm or a Kubeflow PyTorchJob.
//
// Precedence for every launch setting: command line > PET_<NAME> > cluster variables > built-in
// defaults. This file only reads the cluster variables; parse_command_line() applies what it
// returns to the settings neither the command line nor PET_* gave.
//   Slurm (SLURM_JOB_ID set): nnodes = SLURM_NNODES (SLURM_JOB_NUM_NODES), node_rank =
//     SLURM_NODEID, master_addr = first host of SLURM_JOB_NODELIST (SLURM_NODELIST), run_id =
//     SLURM_JOB_ID, nproc_per_node = SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE.
//   Kubeflow PyTorchJob (MASTER_ADDR, WORLD_SIZE and RANK set, LOCAL_RANK not, i.e. not inside a
//     launched worker): master_addr = MASTER_ADDR, master_port = MASTER_PORT, nnodes = WORLD_SIZE
//     (pods), node_rank = RANK. Its PET_NNODES/PET_NODE_RANK/... are ordinary PET_* variables.
//
// Errors: tandem::ConfigError naming the variable, its value and the fix for a malformed value.
// Thread-safety: pure function over the lookup.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace tandem::launcher {

struct ClusterEnv {
  std::string source;  // "Slurm" or "Kubeflow PyTorchJob"; empty when none was detected
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<int> nproc_per_node;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<std::string> run_id;
};

// Returns the value of an environment variable, nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

ClusterEnv detect_cluster_env(const EnvLookup& lookup);

}  // namespace tandem::launcher
