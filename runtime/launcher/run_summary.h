// The report tandemrun prints to stderr when a run ends badly.
#pragma once

#include <string>
#include <vector>

#include "worker_group.h"

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

// After tandemrun itself was asked to stop (signal `signo`) and stop() ran.
void print_interrupt_summary(const std::vector<Worker>& workers, int signo, double grace_period_s);

}  // namespace tandem::launcher
