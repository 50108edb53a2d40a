// The launcher environment contract, parsed once at the edge.
//
// Workers started by tandemrun, torchrun, or Slurm/Kubernetes wrappers that export the torchrun
// variables read them here and nowhere else. A worker started directly by `srun` (RANK and
// WORLD_SIZE unset, SLURM_PROCID and SLURM_NTASKS set) reads Slurm's step variables instead:
// RANK=SLURM_PROCID, WORLD_SIZE=SLURM_NTASKS, LOCAL_RANK=SLURM_LOCALID, LOCAL_WORLD_SIZE from
// SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID, GROUP_RANK=SLURM_NODEID, MASTER_ADDR (if unset) =
// first host of SLURM_STEP_NODELIST/SLURM_JOB_NODELIST, MASTER_PORT (if unset) = 10000 +
// SLURM_JOB_ID % 20000 (same on every task of a job, different for most concurrent jobs),
// TORCHELASTIC_RUN_ID=SLURM_JOB_ID, TORCHELASTIC_RESTART_COUNT=SLURM_RESTART_COUNT. A process
// started by hand (none of these set) is a world of one.
//
// Errors: from_env() throws ConfigError naming the variable, the value seen and the fix, for
// non-numeric values, RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, ports out of range, or
// MASTER_ADDR/MASTER_PORT missing in a world larger than one. It never opens a connection.
// Ownership: DistEnv is a plain value; from_env() copies what it reads and calls the lookup only
// during the call. Thread-safety: a plain value type; from_env() is reentrant when the lookup is.
#pragma once

#include <functional>
#include <string>

namespace tandem {

struct DistEnv {
  int rank = 0;              // RANK
  int world_size = 1;        // WORLD_SIZE
  int local_rank = 0;        // LOCAL_RANK
  int local_world_size = 1;  // LOCAL_WORLD_SIZE
  int group_rank = 0;        // GROUP_RANK (node rank)
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR
  int master_port = 29500;   // MASTER_PORT
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT
  std::string run_id;        // TORCHELASTIC_RUN_ID
  std::string error_file;    // TORCHELASTIC_ERROR_FILE
  // TORCHELASTIC_USE_AGENT_STORE=True (torchrun 2.x): the launcher's agent already serves the
  // store at MASTER_ADDR:MASTER_PORT, so rank 0 connects to it like every other rank.
  bool agent_store = false;
  // TANDEM_FT: set by `tandemrun --ft`, the store key prefix under which the launcher reports
  // workers that died (docs/fault_tolerance.md). Empty: the launcher offers no step-level fault
  // tolerance (torchrun), and a failure restarts the group as before.
  std::string ft_keys;
  // TANDEM_REPLACEMENT: set by `tandemrun --ft-replace` on a worker that replaces a failed one (its
  // incarnation, 1 for the first replacement of that rank). tandem::init() then connects the store
  // only: the replacement joins the running group through FaultTolerantWorld, not epoch 0.
  int ft_join = 0;
  std::string source = "none";  // where the values came from: "torchrun" (any launcher that
                                // sets its variables), "slurm" (srun directly) or "none"

  // Looks variables up with `lookup` (nullptr when unset); tests inject a map.
  using Lookup = std::function<const char*(const char*)>;
  static DistEnv from_env(const Lookup& lookup);
  // Reads the process environment.
  static DistEnv from_env();

  // Throws ConfigError when fields are inconsistent (also called by from_env).
  void validate() const;
  // "rank 1/4 (local 1/2, node 0), master 10.0.0.1:29500".
  std::string describe() const;
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_address(const std::string& address);

}  // namespace tandem
