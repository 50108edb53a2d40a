// tandemrun's command line: parsed and validated once, at the edge, into LauncherOptions.
//
// Everything the launcher does later reads this struct, never argv or the environment, so the
// future fault-tolerant agent can build the same struct from its own sources (a config, a
// rendezvous) and reuse the worker group unchanged.
#pragma once

#include <string>
#include <vector>

namespace tandem::launcher {

// Torchrun's default rendezvous port when --master-port is not given.
inline constexpr int kDefaultMasterPort = 29500;

// Standby workers (standby_pool.h): --standby, --no-standby, or neither (kAuto: on when a restart
// is allowed and the program calls tandem::run_main, while memory allows it).
enum class StandbyMode { kAuto, kOn, kOff };

struct LauncherOptions {
  int nnodes = 1;          // nodes of the current round (multi-node: set by each rendezvous)
  int node_rank = 0;       // GROUP_RANK of this node (multi-node: assigned by each rendezvous)
  int nproc_per_node = 1;  // workers started on this node
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;  // with `standalone`, replaced by a free port at launch
  bool standalone = false;               // pick a free port on master_addr
  std::string run_id;                    // TORCHELASTIC_RUN_ID; generated when empty
  double grace_period_s = 5.0;           // SIGTERM -> SIGKILL delay when stopping workers
  int max_restarts = 0;                  // TORCHELASTIC_MAX_RESTARTS: restarts of the whole group
  double monitor_interval_s = 0.1;       // how often heartbeats are checked (torchrun's default)
  double heartbeat_timeout_s = 0;        // a worker silent this long after its first beat fails; 0 off
  std::string trace_dir;                 // --trace-dir: TANDEM_TRACE_DIR for workers, merged after
  bool ft = false;  // --ft: serve the store, report dead workers to it, keep the survivors running
  bool ft_replace = false;  // --ft-replace (implies --ft): start a replacement for a dead worker
  int metrics_port = 0;                  // --metrics-port: Prometheus endpoint of the local ranks; 0 off
  std::string metrics_host = "127.0.0.1";  // --metrics-host: the address it binds
  StandbyMode standby_mode = StandbyMode::kAuto;
  bool standby = false;  // start the next attempt's workers ahead (decided at launch)
  // Worker output (torchrun's options; semantics and file layout in log_files.h).
  std::string log_dir;                  // base of <run_id>_XXXXXX/attempt_N/...; empty: temp dir
  std::string redirects = "0";          // --redirects: 0-3 or "LOCAL_RANK:0-3,..."
  std::string tee = "0";                // --tee: same syntax
  std::vector<int> local_ranks_filter;  // local ranks shown on the console; empty: all
  std::string launch_sources;           // one line: where nnodes/master/... came from (logged)
  // Multi-node rendezvous (docs/launcher.md "Multi-node"); used only when max_nodes > 1.
  int min_nodes = 1;                 // --nnodes MIN:MAX
  int max_nodes = 1;
  bool node_rank_given = false;      // --node-rank orders the nodes of a round (else join order)
  std::string rdzv_backend = "c10d";
  std::string rdzv_endpoint;         // HOST[:PORT] of the agents' store; empty: master addr/port
  std::string rdzv_id = "none";      // namespace of the rendezvous keys
  std::string rdzv_token_file;       // the job token when TANDEM_JOB_TOKEN is unset
  double rdzv_last_call_s = 30;      // a round with >= MIN nodes closes this long after MIN joined
  double rdzv_join_timeout_s = 600;  // how long an agent waits for a round to close
  double rdzv_node_timeout_s = 15;   // an agent silent this long counts as lost
  std::string local_addr;            // address other nodes' workers use to reach this node
  bool multi_node() const { return max_nodes > 1; }

  std::string program;                    // as the user wrote it (argv[0] of every worker)
  std::string program_path;               // resolved like execvp does (PATH search), executable
  std::vector<std::string> program_args;  // everything after PROGRAM, untouched

  int world_size() const { return nnodes * nproc_per_node; }
};

// What main() should do after reading the command line.
struct CommandLine {
  enum class Action { kRun, kPrintAndExit };
  Action action = Action::kRun;
  LauncherOptions options;  // valid when action == kRun
  std::string text;         // --help / --version output when action == kPrintAndExit
};

// Parses tandemrun's argv (options may be spelled with '-' or '_', like torchrun; each also reads
// torchrun's PET_<NAME> environment variable when not given). Everything from PROGRAM on is kept
// verbatim for the program. Throws tandem::ConfigError with a message naming the bad value and
// the fix for anything invalid; nothing is started before this returns.
CommandLine parse_command_line(int argc, const char* const* argv);

// Resolves `program` like execvp(): a name containing '/' is used as is, anything else is looked
// up in `path_env` (":"-separated; empty entries mean "."). Returns the path to execute. Throws
// tandem::ConfigError when it is missing, a directory or not executable.
std::string resolve_program(const std::string& program, const std::string& path_env);

// Fills what is decided at launch rather than parsed: a generated run id when none was given,
// with --standalone a free port on master_addr, and whether standby workers are kept (kAuto: when
// max_restarts > 0 and the program calls tandem::run_main). Throws tandem::ConfigError when the
// port cannot be picked (e.g. master_addr is not a local address).
void resolve_launch_values(LauncherOptions& options);

// A random 16-hex-digit run id.
std::string generate_run_id();

}  // namespace tandem::launcher
