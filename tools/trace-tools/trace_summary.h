// Where the time went, from a timeline (tandem-trace summary, tandemrun --trace-dir).
// Torch-free.
//
// Per rank (pid), over the wall span from its first event's start to its last event's end:
//   compute     union of "compute" spans (forward, backward, pipeline F/B/W)
//   comm        union of "comm" and "codec" spans and async spans (collectives, bucket reduces,
//               send/recv, compression stages)
//   overlap     comm time that ran while compute ran (comm ∩ compute): hidden communication
//   exposed     comm time with no compute under it (comm − compute)
//   bubble      time inside "pipeline" step spans with no compute (idle stages, recv waits)
//   checkpoint  union of "checkpoint" spans
// Unions, so nested or concurrent spans of one kind count once. Fractions are of the wall span;
// overlap is also reported as a share of comm. The overall row sums the ranks' times.
//
// Thread-safety: pure functions. Errors: Error when the value is not a Chrome trace.
#pragma once

#include "base/json.h"

#include <string>
#include <vector>

namespace tandem::trace {

struct TimeSplit {
  int rank = -1;  // -1 for the overall row
  double wall_us = 0;
  double compute_us = 0;
  double comm_us = 0;
  double overlap_us = 0;
  double exposed_comm_us = 0;
  double bubble_us = 0;
  double checkpoint_us = 0;
  int64_t spans = 0;  // duration events of this rank

  double fraction(double us) const { return wall_us > 0 ? us / wall_us : 0; }
  double overlap_share() const { return comm_us > 0 ? overlap_us / comm_us : 0; }
};

struct TimelineSummary {
  std::vector<TimeSplit> ranks;  // sorted by rank
  TimeSplit overall;
};

TimelineSummary summarize(const JsonValue& trace);

// A fixed-width table, one row per rank and one "all" row; percentages with one decimal.
std::string format_summary(const TimelineSummary& summary);

}  // namespace tandem::trace
