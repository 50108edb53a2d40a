// The environment contract between tandemrun and one worker (the torchrun variables).
#pragma once

#include <string>
#include <vector>

#include "tools/tandemrun/launch/launcher_options.h"

namespace tandem::launcher {

// Which worker an environment is for.
struct WorkerSlot {
  int local_rank = 0;     // 0..nproc_per_node-1 on this node
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: how often the group was restarted so far
  std::string error_file;      // TORCHELASTIC_ERROR_FILE when not empty
  std::string heartbeat_file;  // TANDEM_HEARTBEAT_FILE when not empty (--heartbeat-timeout > 0)
  std::string flight_dir;      // TANDEM_FLIGHT_RECORDER_DIR: where the flight recorder dumps
  std::string metrics_file;    // TANDEM_METRICS_FILE when not empty (--metrics-port)
  int incarnation = 0;  // --ft-replace: > 0 replaces a dead worker (TANDEM_REPLACEMENT)
};

// Global rank of a local worker: node_rank * nproc_per_node + local_rank (torchrun's layout).
int global_rank(const LauncherOptions& options, int local_rank);

// With --ft: the store prefix under which tandemrun reports dead workers of attempt
// `restart_count` (TANDEM_FT; <prefix>/dead/<rank>.<incarnation> and the counter
// <prefix>/dead/count, read by tandem::FaultTolerantWorld).
std::string ft_keys(const LauncherOptions& options, int restart_count);

// Builds the complete environment ("KEY=VALUE" entries) of one worker: `base_env` (tandemrun's
// own environment) with the torchrun variables set or replaced:
//   RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME,
//   ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
//   TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE (True with
//   --ft, else False), TANDEM_FT (with --ft),
// plus OMP_NUM_THREADS=1 when omp_threads_defaulted() says so. Pure function: the one place
// that decides what a worker sees.
std::vector<std::string> build_worker_env(const LauncherOptions& options, const WorkerSlot& slot,
                                          const std::vector<std::string>& base_env);

// True when tandemrun sets OMP_NUM_THREADS=1 for the workers (unset in base_env and more than one
// worker per node), so main() can print torchrun's one-line notice.
bool omp_threads_defaulted(const LauncherOptions& options,
                           const std::vector<std::string>& base_env);

// Copies `environ` into a vector (read once, at start-up).
std::vector<std::string> current_environment();

}  // namespace tandem::launcher
