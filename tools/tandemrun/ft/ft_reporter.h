// tandemrun --ft (docs/fault_tolerance.md): tandemrun serves the workers' rendezvous store, so it
// outlives any worker, and reports each worker that fails to the survivors through it, so their
// quorum closes the moment the dead rank is known instead of at ft.quorum_timeout_s. On several
// nodes the agent that hosts the rendezvous serves it and the others report into it as clients.
//
// Keys (under worker_env.h's ft_keys() of the attempt, which workers read as TANDEM_FT):
// dead/<rank>.<incarnation> = what happened to it (incarnation: 0, or the how-many-th replacement
// of that rank it was, --ft-replace), dead/any/<rank> for each rank of a lost node (whatever its
// incarnation), and dead/count, incremented after each report. Workers write group_failed when
// the group cannot go on.
// Ownership: owns its store connection (serving: the server threads run until destruction).
// Thread-safety: the main thread only. Errors: tandem::Error when the store cannot be served (the
// port is taken, the store module is missing) or reached; RendezvousError from monitor() when it
// stopped answering (this node is cut off from the agent that serves it).
#pragma once

#include <exception>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "tools/tandemrun/elastic/agent_store.h"
#include "tools/tandemrun/launch/launcher_options.h"
#include "tools/tandemrun/launch/worker_group.h"

namespace tandem::launcher {

// What happened in one attempt under --ft, counted across monitor() calls.
struct FtTally {
  int tolerated = 0;           // workers that failed while the others went on
  int replaced = 0;            // replacements started (each uses one of --max-restarts)
  bool group_failed = false;   // the workers said the group cannot go on
};

class FtReporter {
 public:
  // Serves (`serve`) or connects to the store at host:port, the workers' MASTER_ADDR/PORT.
  FtReporter(const LauncherOptions& options, const std::string& host, int port, bool serve);

  // Monitors `group` until the attempt ends, starting from `result` (of group.monitor()): each
  // worker that failed on its own is reported (a hung one SIGKILLed first, so it cannot come
  // back into a world that went on without it) and, with --ft-replace, replaced while
  // --max-restarts allows, for as long as some worker goes on. Returns the outcome that ends the
  // attempt: kWorkerFailed when the workers said the group cannot go on (tally.group_failed) or
  // nobody is left running; kSucceeded when the others finished.
  MonitorResult monitor(WorkerGroup& group, int restart_count, MonitorResult result, FtTally& tally);

  // Reports ranks first..first+count-1 dead: their node was lost (multi-node). Their peers then
  // stop waiting for their votes and for them to join the next epoch (ft.quorum_timeout_s).
  void report_lost_ranks(int first, int count, int restart_count, const std::string& what);

  // A new attempt (whole-group restart): nobody is reported in it yet.
  void new_attempt() { reported_.clear(); }

 private:
  int report_failures(WorkerGroup& group, int restart_count);
  bool group_failed(int restart_count);
  // A request failed: the store stopped answering (this node is on the far side of a partition).
  [[noreturn]] void cut_off(const std::exception& e) const;

  LauncherOptions options_;
  std::string endpoint_;  // host:port
  std::unique_ptr<StoreConnection> store_;
  std::set<std::pair<int, int>> reported_;  // local rank, incarnation
};

}  // namespace tandem::launcher
