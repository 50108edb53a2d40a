// The report tandemrun prints to stderr when a run ends badly.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/launch_contract.h"
#include "tools/tandemrun/launch/worker_group.h"

namespace tandem::launcher {

// One line per worker: "rank R (pid P) exited with code C" / "... was killed by signal N (NAME)",
// plus how tandemrun stopped it, if it did.
std::string describe_worker(const Worker& worker, double grace_period_s);

// After a worker failure and stop(): names the first failed worker, then the fates of the others.
//   tandemrun: worker failed: rank 1 (pid 1234) exited with code 3
//   tandemrun: other workers:
//   tandemrun:   rank 0 (pid 1233) was killed by signal 15 (SIGTERM) after tandemrun sent SIGTERM
void print_failure_summary(const std::vector<Worker>& workers, int failed_local_rank,
                           double grace_period_s);

// One failure of one attempt, as remembered across restarts.
struct FailureRecord {
  int restart_count = 0;  // the attempt (TORCHELASTIC_RESTART_COUNT) it happened in
  int rank = 0;
  pid_t pid = -1;
  std::string host;
  std::string what;                  // "exited with code 3", "was killed by signal 9 (SIGKILL)", ...
  std::optional<launch::ErrorReport> error;  // from its error file, when it wrote one
  std::string final_reason;          // why a restart cannot fix it (root_cause.h); "" if it may
};

// Records the failure of `failed` (after stop(): its exit is known) on this host.
FailureRecord record_failure(const Worker& failed, int restart_count, double heartbeat_timeout_s);

// How a failed worker failed: its exit, or the heartbeat timeout for a hung one.
std::string describe_failure(const Worker& worker, double heartbeat_timeout_s);

// The root cause block printed when tandemrun gives up (the first failure of the whole run), and,
// when more than one attempt failed, one line per attempt:
//   tandemrun: root cause (first failure): rank 1 on host H (pid P), restart 0: exited with code 1
//   tandemrun:   error: RuntimeError: boom
//   tandemrun: failures: 3 attempts (--max-restarts 2)
//   tandemrun:   restart 0: rank 1 (pid P) exited with code 1: RuntimeError: boom
void print_root_cause(const std::vector<FailureRecord>& failures, int max_restarts);

// tandemrun itself was asked to stop by signal `signo`: forwards it to the workers (SIGKILL after
// grace_period_s), prints what became of each, and returns the exit status, 128 + signo.
int stop_on_signal(WorkerGroup& group, int signo, double grace_period_s);

}  // namespace tandem::launcher
