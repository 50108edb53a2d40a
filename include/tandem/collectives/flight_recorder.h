// The flight recorder: each process keeps a bounded ring of its most recent collectives and
// point-to-point ops - sequence number, group, op, what it moves (dtype and size), when it was
// enqueued, started and ended, and its state - and writes it out when something goes wrong, so
// `tandem-trace flight DIR` can say which rank is behind, where the ranks first disagree, and what
// every rank was waiting on (PyTorch's NCCL flight recorder, for every backend).
//
// Recording is on by default (TANDEM_FLIGHT_RECORDER=0 turns it off; `capacity` ops are kept,
// TANDEM_FLIGHT_RECORDER_ENTRIES, default 2048). A dump goes to <dir>/flight_rank<R>.json, where
// dir is TANDEM_FLIGHT_RECORDER_DIR (tandemrun sets it; else the system temp directory's
// tandem-flight-<job> folder) and R the process's RANK. Dumps happen on a collective timeout, on
// abort(), on SIGUSR1 (tandemrun sends it before stopping a group it found hung or failed), and
// on request (dump()). The file is written to a temporary name and renamed.
//
// The ring is plain fixed-size records in shared memory (a memfd; flight_ring.h), so that
// tandemrun can write the dump of a worker that cannot: one stopped by SIGSTOP or a debugger
// (reason "stopped"). Texts longer than their field (group 127 bytes, backend 15, op 31, detail
// 127, error 319) are cut and end with "...". Recording calls no malloc.
//
// Ownership: one process-wide recorder (FlightRecorder::instance()). Thread-safety: every member
// is thread-safe; record calls take one short mutex. Errors: dump() reports failures as its return
// value (it runs on error paths and must not throw).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {

namespace detail {
struct FlightRingHeader;  // collectives/flight_ring_layout.h
}

class FlightRecorder {
 public:
  enum class State { kEnqueued, kStarted, kCompleted, kFailed };

  struct Entry {
    uint64_t id = 0;           // position in this process's record (0, 1, ...)
    std::string group;         // "[0, 1, 2]": the world ranks of the communicator
    std::string backend;       // "gloo", "nccl"
    std::string op;            // "allreduce", "send", ...
    uint64_t seq = 0;          // the op's number in its communicator ("allreduce #12")
    bool p2p = false;          // send/recv, numbered apart from collectives
    std::string detail;        // "sum, 4.00 MiB float32", "to 1, tag 3"
    double enqueued_s = 0;     // seconds since the epoch (system clock: comparable across hosts)
    double started_s = 0;      // 0 until started
    double ended_s = 0;        // 0 until completed or failed
    State state = State::kEnqueued;
    std::string error;         // when failed
  };

  static FlightRecorder& instance();

  // Returns the entry's id, or UINT64_MAX when recording is off.
  uint64_t record(const std::string& group, const std::string& backend, const std::string& op,
                  uint64_t seq, bool p2p, const std::string& detail);
  void started(uint64_t id);
  void ended(uint64_t id, const std::string& error = "");

  bool enabled() const { return enabled_; }
  // The kept entries, oldest first.
  std::vector<Entry> entries() const;

  // Writes the dump (see the top); returns its path, or "" with `error` set when it failed or
  // recording is off. `reason`: "timeout", "abort", "signal", ...
  std::string dump(const std::string& reason, std::string* error = nullptr) const;
  // The directory and file dumps go to.
  std::string dump_path() const;

  // Dump on SIGUSR1 from a thread of the recorder's own ("tandem-flight"), joined at exit. Called
  // by tandem::init(); idempotent.
  void install_signal_handler();

  // Tests: start over with this capacity and switch.
  void reset(size_t capacity, bool enabled);

 private:
  FlightRecorder();
  ~FlightRecorder();
  void map_ring(size_t capacity);  // under mutex_ or in the constructor
  void unmap_ring();               // likewise

  mutable std::mutex mutex_;
  detail::FlightRingHeader* ring_ = nullptr;  // header and records; null while off
  size_t ring_bytes_ = 0;
  int ring_fd_ = -1;  // the memfd; -1 for private memory (no memfd on this system)
  std::atomic<bool> enabled_{true};
  struct SignalThread;
  SignalThread* signal_thread_ = nullptr;
};

}  // namespace tandem
