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
// Not thread-safe; one thread drives it. It never creates threads: output, exits and signals are
// multiplexed in one poll() loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "fd_io.h"
#include "launcher_options.h"
#include "output_pump.h"
#include "signal_relay.h"
#include "worker_status.h"

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
};

struct MonitorResult {
  enum class Outcome { kSucceeded, kWorkerFailed, kInterrupted };
  Outcome outcome = Outcome::kSucceeded;
  int failed_local_rank = -1;  // kWorkerFailed: the first worker seen exiting non-zero or killed
  int signal = 0;              // kInterrupted: the stop signal tandemrun received
};

class WorkerGroup {
 public:
  // `signals` must outlive the group; its descriptor is part of the poll loop.
  WorkerGroup(LauncherOptions options, std::vector<std::string> base_env, SignalRelay& signals);
  // Kills (SIGKILL) and reaps anything still running, so an exception cannot leave workers behind.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts nproc_per_node workers and returns once each has exec'd the program. If one cannot be
  // started, kills the ones already running and throws tandem::Error naming the rank and cause.
  void start(int restart_count);

  // Forwards output until the run is decided: every worker exited 0 (kSucceeded), one exited
  // non-zero or was killed (kWorkerFailed; the others are left running for stop()), or tandemrun
  // received SIGINT/SIGTERM/SIGHUP/SIGQUIT (kInterrupted). Blocks; wake-ups are event driven.
  MonitorResult monitor();

  // Ends the run in every outcome: sends `first_signal` to every worker's process group, gives
  // running workers up to `grace` to exit (output keeps flowing), then SIGKILLs every group
  // (which also ends processes a worker left behind) and reaps the workers. Another stop signal
  // to tandemrun during the grace period skips the rest of it.
  void stop(int first_signal, std::chrono::milliseconds grace);

  const std::vector<Worker>& workers() const { return workers_; }

 private:
  void spawn(int local_rank, int restart_count);
  // One pass of the event loop: waits (at most until `deadline`) for output or a signal, pumps
  // output, records stop signals and worker exits.
  void pump_once(std::optional<std::chrono::steady_clock::time_point> deadline);
  void refresh_exits();
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
};

}  // namespace tandem::launcher
