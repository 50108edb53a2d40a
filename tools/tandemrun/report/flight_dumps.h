// tandemrun's part of the flight recorder (include/tandem/collectives/flight_recorder.h): where
// each attempt's workers dump (TANDEM_FLIGHT_RECORDER_DIR), asking the workers still running to
// dump before a failed or hung group is stopped, and dumping a stopped worker's record for it.
#pragma once

#include <sys/types.h>

#include <string>

namespace tandem::launcher {

// The dump directory of attempt `restart_count`: <log dir>/flight/attempt_<n> with --log-dir,
// else <TMPDIR or /tmp>/tandem-flight-<run id>/attempt_<n> (kept after tandemrun exits).
std::string flight_dir(const std::string& log_dir, const std::string& run_id, int restart_count);

// Whether process `pid` catches SIGUSR1 (/proc/<pid>/status, SigCgt): tandem workers do, and only
// those are asked to dump (the signal would kill another program).
bool catches_sigusr1(pid_t pid);

// The dumps in `dir` ("flight_rank*.json"), counted.
int count_flight_dumps(const std::string& dir);

// Writes <dir>/flight_rank<rank>.json (reason "stopped") from the flight-recorder ring of process
// `pid`, read without its help (include/tandem/collectives/flight_ring.h): for a worker stopped by
// SIGSTOP or a debugger, which cannot dump by itself. Returns what happened, for tandemrun's log
// ("rank 1 is stopped: tandemrun wrote its flight record (5 ops) to ..."); "" when the process
// has no ring (not a tandem worker, or its recorder is off). Never throws.
std::string dump_stopped_worker(pid_t pid, int rank, const std::string& dir);

}  // namespace tandem::launcher
