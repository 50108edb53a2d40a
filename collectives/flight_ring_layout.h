// The flight recorder's ring as it lies in memory (include/tandem/collectives/flight_ring.h): a
// header and `capacity` fixed-size records of plain data, in a memfd the process maps shared, so
// that tandemrun can read it through /proc/<pid>/fd without the process's help (a stopped worker).
// Private: the recorder writes it (flight_recorder.cpp), flight_ring.cpp reads it.
//
// Each record is a seqlock: `seq` is odd while the record is being written (bumped before the
// first field and after the last), even when it is whole, 0 while never written. A reader copies
// the record between two reads of `seq` and keeps the copy only when both are the same even value.
// Writers are serialized by the recorder's mutex; the lock is only for readers outside it.
#pragma once

#include <tandem/collectives/flight_recorder.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tandem::detail {

constexpr char kFlightRingMagic[8] = {'T', 'N', 'D', 'M', 'F', 'L', 'T', '1'};
constexpr uint32_t kFlightRingVersion = 1;
// The memfd's name: tandemrun finds the ring among a process's fds by it ("/memfd:<name>
// (deleted)").
constexpr const char* kFlightRingName = "tandem-flight-ring";

struct FlightRingHeader {
  char magic[8];
  uint32_t version;
  uint32_t record_size;  // sizeof(FlightRingRecord): a reader built otherwise refuses the ring
  uint64_t capacity;     // records that follow the header
  std::atomic<uint64_t> next_id;  // ids [next_id - capacity, next_id) are in the ring
  int32_t rank;                   // RANK and WORLD_SIZE when the ring was made
  int32_t world_size;
  int64_t pid;
  char reserved[16];
};

// Text longer than its field is cut at a UTF-8 character boundary and ends with "...".
struct FlightRingRecord {
  std::atomic<uint64_t> seq;  // the seqlock (above)
  uint64_t id;
  uint64_t op_seq;
  double enqueued_s, started_s, ended_s;
  uint8_t state;  // FlightRecorder::State
  uint8_t p2p;
  char pad[6];
  char group[128];
  char backend[16];
  char op[32];
  char detail[128];
  char error[320];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the seqlock lives in shared memory");
static_assert(sizeof(FlightRingHeader) == 64, "the ring's header is 64 bytes");
static_assert(sizeof(FlightRingRecord) % 8 == 0, "records stay 8-byte aligned");

inline size_t flight_ring_bytes(uint64_t capacity) {
  return sizeof(FlightRingHeader) + capacity * sizeof(FlightRingRecord);
}

inline FlightRingRecord* flight_ring_records(FlightRingHeader* h) {
  return reinterpret_cast<FlightRingRecord*>(reinterpret_cast<char*>(h) + sizeof(FlightRingHeader));
}

// Copies `text` into a fixed field, NUL-terminated; too long, it is cut with a "..." marker.
template <size_t N>
void put_text(char (&field)[N], const std::string& text) {
  if (text.size() < N) {
    std::memcpy(field, text.data(), text.size());
    field[text.size()] = '\0';
    return;
  }
  size_t keep = N - 4;  // room for "..." and the NUL
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80)
    --keep;  // a whole character
  std::memcpy(field, text.data(), keep);
  std::memcpy(field + keep, "...", 4);
}

// The text of a fixed field (at most N bytes, whatever its content).
template <size_t N>
std::string get_text(const char (&field)[N]) {
  return std::string(field, strnlen(field, N));
}

// The entry a record holds. Not synchronized: callers hold the writers' mutex or the seqlock.
inline FlightRecorder::Entry entry_of(const FlightRingRecord& r) {
  FlightRecorder::Entry e;
  e.id = r.id;
  e.seq = r.op_seq;
  e.p2p = r.p2p != 0;
  e.enqueued_s = r.enqueued_s;
  e.started_s = r.started_s;
  e.ended_s = r.ended_s;
  e.state = r.state <= static_cast<uint8_t>(FlightRecorder::State::kFailed)
                ? static_cast<FlightRecorder::State>(r.state)
                : FlightRecorder::State::kFailed;
  e.group = get_text(r.group);
  e.backend = get_text(r.backend);
  e.op = get_text(r.op);
  e.detail = get_text(r.detail);
  e.error = get_text(r.error);
  return e;
}

}  // namespace tandem::detail
