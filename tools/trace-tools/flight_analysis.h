// `tandem-trace flight DIR`: reads every rank's flight-recorder dump (flight_rank<R>.json, see
// include/tandem/collectives/flight_recorder.h) and says in plain words which rank is behind and
// at which collective, the first collective where the ranks disagree (another op, size or dtype),
// and what every rank was waiting on when it dumped.
//
// Collectives are aligned by (group, sequence number): every rank of a group numbers its
// collectives alike, so the same number must be the same op everywhere. A rank's dump keeps only
// its most recent ops, so a comparison covers the numbers present in both dumps.
// Ownership: plain values. Thread-safety: reentrant. Errors: tandem::Error when DIR holds no dump
// or a dump is not a flight-recorder file (naming it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem::trace {

struct FlightOp {
  std::string group, backend, op, detail, state, error;
  uint64_t seq = 0;
  bool p2p = false;
  double enqueued_s = 0, started_s = 0, ended_s = 0;
  bool done() const { return state == "completed"; }
};

struct FlightDump {
  int rank = 0;
  int world_size = 0;
  std::string reason;
  double dumped_at = 0;
  std::vector<FlightOp> ops;  // oldest first
};

// Every flight_rank*.json of `dir`, by rank.
std::map<int, FlightDump> read_flight_dir(const std::string& dir);

struct FlightReport {
  std::vector<std::string> missing;         // "rank 3 wrote no dump (...)"
  std::vector<std::string> behind;          // per group where some rank issued fewer collectives
  std::string first_disagreement;           // "" when the ranks agree on every common number
  std::vector<std::string> waiting;         // per rank: its oldest op not completed, or "idle"
};

FlightReport analyze_flight(const std::map<int, FlightDump>& dumps);
std::string format_flight_report(const FlightReport& report);

}  // namespace tandem::trace
