// The flight recorder's record read from outside the process, and the one writer of its dumps
// (include/tandem/collectives/flight_recorder.h says what a dump holds and when it is written).
//
// A process's ring lives in a memfd named "tandem-flight-ring" that the process maps shared and
// keeps open, so another process of the same user (tandemrun) can read it through
// /proc/<pid>/fd/<n> while the process cannot answer: a worker stopped by SIGSTOP or a debugger.
// tandemrun turns it into the same flight_rank<R>.json the process writes itself, with reason
// "stopped". Nothing is left behind: the kernel frees the memfd with the process.
//
// A record that was being written when it was read (the process stopped halfway through an
// update) is torn: it is left out of the ops and named in the dump's "torn" list, never guessed.
//
// Ownership: plain values. Thread-safety: reentrant. Errors: read_flight_ring() throws
// tandem::Error naming the ring and what is wrong; the others report failures by their result.
#pragma once

#include <tandem/collectives/flight_recorder.h>

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// What a dump holds besides the reason: the process and its kept ops.
struct FlightSnapshot {
  int rank = 0;
  int world_size = 1;
  int64_t pid = 0;
  std::vector<FlightRecorder::Entry> entries;  // oldest first
  std::vector<uint64_t> torn;                  // ring slots being written when read
};

// Writes `snapshot` as a flight-recorder dump (format "tandem-flight-recorder", version 1) to
// `path`, creating its directory, through a temporary name and a rename. Returns false with
// `error` set when it cannot. The recorder's own dump() and tandemrun both write through it.
bool write_flight_dump(const FlightSnapshot& snapshot, const std::string& reason,
                       const std::string& path, std::string* error = nullptr);

// The path through which process `pid`'s ring can be opened (/proc/<pid>/fd/<n>), or "" when it
// has none (not a tandem process, the recorder is off, or its fds are not readable by this user).
std::string find_flight_ring(pid_t pid);

// Reads the ring at `path` (a find_flight_ring() path): whole records by id, oldest first, torn
// ones apart. Throws tandem::Error when it is not a flight-recorder ring of this version.
FlightSnapshot read_flight_ring(const std::string& path);

}  // namespace tandem
