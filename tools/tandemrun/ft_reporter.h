// tandemrun --ft (docs/fault_tolerance.md): tandemrun serves the workers' rendezvous store, so it
// outlives any worker, and reports each worker that fails to the survivors through it, so their
// quorum closes the moment the dead rank is known instead of at ft.quorum_timeout_s.
//
// Keys (under worker_env.h's ft_keys() of the attempt, which workers read as TANDEM_FT):
// dead/<rank>.<incarnation> = what happened to it (incarnation: 0, or the how-many-th replacement
// of that rank it was, --ft-replace), and dead/count, incremented after each report. Workers
// write group_failed when the group cannot go on.
// Ownership: owns the store (its server threads run until destruction). Thread-safety: the main
// thread only. Errors: tandem::Error when the store cannot be served (the port is taken, the store
// module is missing).
#pragma once

#include <memory>
#include <set>
#include <utility>

#include "tools/tandemrun/agent_store.h"
#include "tools/tandemrun/launcher_options.h"
#include "tools/tandemrun/worker_group.h"

namespace tandem::launcher {

class FtReporter {
 public:
  // Serves the store at options.master_addr:master_port (the workers' MASTER_ADDR/PORT).
  explicit FtReporter(const LauncherOptions& options);

  // Reports every worker of `group` that failed on its own and was not reported yet: a hung one
  // is SIGKILLed first, so it cannot come back into a world that went on without it. Returns how
  // many it reported now.
  int report_failures(WorkerGroup& group, int restart_count);

  // A worker said the group cannot go on (fewer than ft.min_replicas ranks, nobody left who
  // holds the training state): tandemrun restarts it instead of replacing ranks.
  bool group_failed(int restart_count);

  // A new attempt (whole-group restart): nobody is reported in it yet.
  void new_attempt() { reported_.clear(); }

 private:
  LauncherOptions options_;
  std::unique_ptr<StoreConnection> store_;
  std::set<std::pair<int, int>> reported_;  // local rank, incarnation
};

}  // namespace tandem::launcher
