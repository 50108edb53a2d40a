// The local worker processes of one run: start them, watch them, stop them.
//
// Built to be driven by a restart loop later (the fault-tolerant agent): start() -> monitor() ->
// stop() can run again on the same object with a higher restart count.
//
// Process model: every worker is forked and exec'd in its own process group (so a stop reaches
// anything the worker started) with PR_SET_PDEATHSIG=SIGKILL (so a SIGKILLed launcher leaves no
// worker behind). An exited worker is left a zombie (waitid WNOWAIT) until stop() has signalled
// its process group: the zombie keeps its pid, so the group id cannot be reused by an unrelated
// process that a late killpg() would hit.
//
// Standby (standby_pool.h): after each start() that leaves restarts, one more process per local
// rank is started and parked in tandem::run_main (TANDEM_STANDBY_FD); the next start() hands each
// its worker environment instead of forking, so a restart costs no process start or library
// loading. Process starts themselves are process_launch.h's.
//
// Not thread-safe; one thread drives it, and it must be the main thread: PR_SET_PDEATHSIG fires
// when the forking *thread* exits. It never creates threads: output, exits and signals are
// multiplexed in one poll() loop. Other threads in the process (the multi-node rendezvous store)
// are harmless: the child makes only async-signal-safe calls between fork() and execve().
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/launch/launcher_options.h"
#include "tools/tandemrun/launch/log_files.h"
#include "tools/tandemrun/report/metrics_server.h"
#include "tools/tandemrun/launch/output_pump.h"
#include "tools/tandemrun/launch/process_launch.h"
#include "tools/tandemrun/launch/signal_relay.h"
#include "tools/tandemrun/launch/standby_pool.h"
#include "tools/tandemrun/launch/worker_status.h"

namespace tandem::launcher {

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  std::optional<WorkerExit> exit;  // set once it has exited
  int stop_signal = 0;             // first signal tandemrun sent while it still ran (0: none)
  bool escalated = false;          // it was still running when the grace period ended (SIGKILL)
  bool grace_cut_short = false;    // escalated early: a second stop signal reached tandemrun
  bool reaped = false;
  std::string error_file;      // its TORCHELASTIC_ERROR_FILE
  std::string heartbeat_file;  // its TANDEM_HEARTBEAT_FILE (empty: heartbeats off)
  bool hung = false;           // failed by heartbeat timeout (it had not exited then)
  double silent_s = 0;         // when hung: seconds since its last heartbeat
  int failure_order = -1;      // 0, 1, ...: the order tandemrun saw workers fail (-1: did not)
  int incarnation = 0;         // --ft-replace: how many processes held this rank before it

  // Failed by itself: exited non-zero or was killed before tandemrun signalled it, or hung.
  bool failed_on_its_own() const {
    return hung || (exit && !exit->success() && stop_signal == 0);
  }
};

struct MonitorResult {
  // kExternal: the monitor hook (set_monitor_hook) asked to stop; the workers are left running.
  enum class Outcome { kSucceeded, kWorkerFailed, kInterrupted, kExternal };
  Outcome outcome = Outcome::kSucceeded;
  int failed_local_rank = -1;  // kWorkerFailed: the first worker seen exiting non-zero, killed,
                               // or silent longer than the heartbeat timeout (Worker::hung)
  int signal = 0;              // kInterrupted: the stop signal tandemrun received
};

class WorkerGroup {
 public:
  // `signals` must outlive the group; its descriptor is part of the poll loop.
  WorkerGroup(LauncherOptions options, std::vector<std::string> base_env, SignalRelay& signals);
  // Kills (SIGKILL) and reaps anything still running, so an exception cannot leave workers behind;
  // removes the per-run directory of error and heartbeat files.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts nproc_per_node workers and returns once each has exec'd the program. If one cannot be
  // started, kills the ones already running and throws tandem::Error naming the rank and cause.
  // Each worker gets its own (fresh) TORCHELASTIC_ERROR_FILE and, with --heartbeat-timeout,
  // TANDEM_HEARTBEAT_FILE in a private directory of this group.
  void start(int restart_count);

  // The MASTER_PORT the next start() hands out (--standalone picks a fresh one per restart).
  void set_master_port(int port) { options_.master_port = port; }

  // Multi-node: this node's place in the round the next start() runs in (GROUP_RANK, the number
  // of nodes, the workers' store address); decided by the rendezvous.
  void set_layout(int node_rank, int nnodes, const std::string& master_addr, int master_port) {
    options_.node_rank = node_rank;
    options_.nnodes = nnodes;
    options_.master_addr = master_addr;
    options_.master_port = master_port;
  }

  // Multi-node: monitor() also calls `hook` about every `interval` (from this thread) and returns
  // kExternal when it says true (another node failed, a node was lost). Empty: no hook.
  void set_monitor_hook(std::function<bool()> hook, std::chrono::milliseconds interval) {
    hook_ = std::move(hook);
    hook_interval_ = interval;
  }

  // Forwards output until the run is decided: every worker exited 0 (kSucceeded), one exited
  // non-zero or was killed (kWorkerFailed; the others are left running for stop()), or tandemrun
  // received SIGINT/SIGTERM/SIGHUP/SIGQUIT (kInterrupted). Blocks; wake-ups are event driven,
  // plus one every --monitor-interval to check heartbeat files when --heartbeat-timeout is on.
  MonitorResult monitor();

  // Ends the run in every outcome: sends `first_signal` to every worker's process group, gives
  // running workers up to `grace` to exit (output keeps flowing), then SIGKILLs every group
  // (which also ends processes a worker left behind) and reaps the workers. Another stop signal
  // to tandemrun during the grace period skips the rest of it. Stopped (SIGSTOP) workers get a
  // SIGCONT after `first_signal`, so a hung-by-stop worker can act on it.
  void stop(int first_signal, std::chrono::milliseconds grace);

  // Keeps forwarding output, without signalling anyone, until `done()` (checked after every
  // event), every worker has exited, or `limit` has passed; a stop signal to tandemrun ends it
  // early. For after a failure that looks like the consequence of another worker's failure: that
  // worker gets the time to fail by itself (and to write its error file) before the group is
  // stopped.
  void settle(std::chrono::milliseconds limit, const std::function<bool()>& done);

  // Before stopping a failed or hung group: asks every running worker that catches SIGUSR1 (a
  // tandem worker) to dump its flight recorder, waits up to `limit` for the dumps, and says where
  // they are (a worker that failed on a collective timeout has dumped already). A stopped worker
  // (SIGSTOP, a debugger) is not asked, as it is not continued before the group is stopped:
  // tandemrun reads its ring and writes its dump itself (dump_stopped_worker, reason "stopped").
  void request_flight_dumps(int restart_count, std::chrono::milliseconds limit);
  // The flight recorder's directory of attempt `restart_count` (TANDEM_FLIGHT_RECORDER_DIR).
  std::string flight_dir(int restart_count) const;

  const std::vector<Worker>& workers() const { return workers_; }

  // --ft: the failures seen so far were handled (reported to the survivors): the next monitor()
  // returns kWorkerFailed only for a new one, and kSucceeded once the others exit 0. Heartbeat
  // silence counts from now: the survivors were waiting for the failed worker, not hung.
  void clear_failures() {
    first_failure_ = -1;
    cleared_at_ = std::chrono::steady_clock::now();
  }
  // --ft: SIGKILLs a hung worker's process group (it stays a zombie until stop(), as any exit).
  void kill_worker(int local_rank);
  // --ft-replace: ends and reaps the failed worker `local_rank` (and what it left running), and
  // starts its replacement (the next incarnation, TANDEM_REPLACEMENT) from the standby of that local
  // rank when there is one; then, with `restock`, starts a new standby for the rank's next
  // replacement (memory permitting, as start_standby()). Returns whether the standby was used.
  // Throws tandem::Error when the replacement cannot be started.
  bool replace_worker(int local_rank, int restart_count, bool restock);

  // The first stop signal (SIGINT, SIGTERM, ...) tandemrun received during the run, also one that
  // cut a stop() or settle() short; 0 if none. A run that received one is never restarted.
  int received_stop_signal() const { return received_stop_signal_; }

 private:
  Worker spawn(int local_rank, int restart_count, int incarnation = 0);
  // The program with `env`, its stdin /dev/null.
  LaunchSpec program_spec(std::vector<std::string> env, std::string who) const;
  // Starts one standby per local rank for the attempt after `restart_count`, when the options
  // (and, by default, memory) allow it.
  void start_standby(int restart_count);
  // One pass of the event loop: waits (at most until `deadline`) for output or a signal, pumps
  // output, records stop signals and worker exits.
  void pump_once(std::optional<std::chrono::steady_clock::time_point> deadline);
  void refresh_exits();
  void check_heartbeats();
  void signal_all(int signo);
  bool any_running() const;
  void reap_all();

  LauncherOptions options_;
  std::vector<std::string> base_env_;
  SignalRelay& signals_;
  OutputPump output_;
  UniqueFd dev_null_;
  std::vector<Worker> workers_;
  std::vector<int> pending_stop_signals_;
  int first_failure_ = -1;
  std::optional<std::chrono::steady_clock::time_point> cleared_at_;  // last clear_failures()
  int failures_seen_ = 0;
  int received_stop_signal_ = 0;
  std::string state_dir_;  // private directory for error and heartbeat files
  // --log-dir/--redirects/--tee: per-attempt log files and error files (log_files.h).
  StdSpec redirects_;
  StdSpec tee_;
  std::optional<RunLogDir> log_dir_;
  StandbyPool standby_;   // empty without standby workers
  int activated_ = 0;     // workers of the current start() taken over from standbys
  bool memory_warned_ = false;  // said once why no standby is kept
  std::function<bool()> hook_;
  std::chrono::milliseconds hook_interval_{100};
  // --metrics-port: the endpoint, and the directory the workers' live metrics files live in
  // (/dev/shm when there is one: they are rewritten twice a second).
  std::string metrics_dir_;
  std::unique_ptr<MetricsServer> metrics_;
};

}  // namespace tandem::launcher
