// The flight recorder (include/tandem/collectives/flight_recorder.h).
#include <tandem/collectives/flight_recorder.h>

#include <tandem/collectives/flight_ring.h>

#include "base/launch_contract.h"
#include "collectives/flight_ring_layout.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

namespace tandem {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string env_or(const char* name, const std::string& fallback) {
  return launch::env(name).value_or(fallback);
}

// The signal handler's end of the pipe (async-signal-safe: write(2) only).
std::atomic<int> g_signal_fd{-1};

void on_sigusr1(int) {
  const int fd = g_signal_fd.load();
  if (fd >= 0) {
    const char c = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd, &c, 1);
  }
}

// Writes one record under its seqlock: odd from the first store to the last (flight_ring_layout.h).
class RecordWrite {
 public:
  explicit RecordWrite(detail::FlightRingRecord& r)
      : r_(r), seq_(r.seq.load(std::memory_order_relaxed)) {
    r_.seq.store(seq_ + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~RecordWrite() { r_.seq.store(seq_ + 2, std::memory_order_release); }
  RecordWrite(const RecordWrite&) = delete;
  RecordWrite& operator=(const RecordWrite&) = delete;

 private:
  detail::FlightRingRecord& r_;
  const uint64_t seq_;
};

int env_int(const char* name, int fallback) {
  return static_cast<int>(launch::env_int(name, fallback));
}

// The recorder whose ring a forked child must stop sharing (fork_child below).
std::atomic<FlightRecorder*> g_recorder{nullptr};

}  // namespace

// Waits on the pipe and dumps for each signal; stopped and joined by the recorder's destructor.
struct FlightRecorder::SignalThread {
  int fds[2] = {-1, -1};
  std::thread thread;
  std::atomic<bool> stop{false};
};

FlightRecorder& FlightRecorder::instance() {
  static FlightRecorder recorder;
  return recorder;
}

FlightRecorder::FlightRecorder() {
  enabled_ = env_or(launch::kEnvFlightRecorder, "1") != "0";
  const long entries = launch::env_int(launch::kEnvFlightRecorderEntries, 2048);
  const size_t capacity = entries > 0 ? static_cast<size_t>(entries) : 2048;
  if (enabled_) map_ring(capacity);
  // A forked child gets a private copy of the ring: sharing it, its records would land in its
  // parent's (and the parent's in the child's view).
  g_recorder = this;
  ::pthread_atfork(nullptr, nullptr, [] {
    FlightRecorder* r = g_recorder.load();
    if (r == nullptr || r->ring_fd_ < 0) return;
    ::mmap(r->ring_, r->ring_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, r->ring_fd_,
           0);
    ::close(r->ring_fd_);
    r->ring_fd_ = -1;
  });
}

// The ring lives outside malloc's heap, in pages mapped here once: records copy their text into
// fixed fields. (Strings allocated op by op lived for a whole ring's turn among each step's
// short-lived buffers and kept glibc's heap from shrinking: the main job's peak RSS grew 3-5% over
// 300 steps.) A memfd, mapped shared and kept open, lets tandemrun read the ring of a stopped
// process (flight_ring.h); where there is none, the ring is private memory that only dumps reach.
void FlightRecorder::map_ring(size_t capacity) {
  const size_t bytes = detail::flight_ring_bytes(capacity);
  void* mem = MAP_FAILED;
  int fd = ::memfd_create(detail::kFlightRingName, MFD_CLOEXEC);
  // Every page reserved now: a full tmpfs would otherwise be a SIGBUS at some later record.
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
      ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0) {
    mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (mem == MAP_FAILED && fd >= 0) {
    ::close(fd);
    fd = -1;
  }
  if (mem == MAP_FAILED)
    mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    enabled_ = false;  // no memory for the ring: record nothing rather than fail the job
    return;
  }
  std::memset(mem, 0, bytes);
  auto* h = static_cast<detail::FlightRingHeader*>(mem);
  h->version = detail::kFlightRingVersion;
  h->record_size = sizeof(detail::FlightRingRecord);
  h->capacity = capacity;
  h->rank = env_int(launch::kEnvRank, 0);
  h->world_size = env_int(launch::kEnvWorldSize, 1);
  h->pid = ::getpid();
  std::atomic_thread_fence(std::memory_order_release);
  // The magic last: a reader that sees it sees a whole header.
  std::memcpy(h->magic, detail::kFlightRingMagic, sizeof h->magic);
  ring_ = h;
  ring_bytes_ = bytes;
  ring_fd_ = fd;
}

void FlightRecorder::unmap_ring() {
  if (ring_ != nullptr) ::munmap(ring_, ring_bytes_);
  if (ring_fd_ >= 0) ::close(ring_fd_);
  ring_ = nullptr;
  ring_bytes_ = 0;
  ring_fd_ = -1;
}

FlightRecorder::~FlightRecorder() {
  g_recorder = nullptr;
  if (signal_thread_ == nullptr) return;
  ::signal(SIGUSR1, SIG_DFL);
  g_signal_fd = -1;
  signal_thread_->stop = true;
  const char c = 0;
  [[maybe_unused]] const ssize_t n = ::write(signal_thread_->fds[1], &c, 1);
  if (signal_thread_->thread.joinable()) signal_thread_->thread.join();
  ::close(signal_thread_->fds[0]);
  ::close(signal_thread_->fds[1]);
  delete signal_thread_;
}

void FlightRecorder::reset(size_t capacity, bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  unmap_ring();
  enabled_ = enabled;
  if (enabled && capacity > 0) map_ring(capacity);
}

namespace {

detail::FlightRingRecord* find_record(detail::FlightRingHeader* ring, uint64_t id) {
  if (id == UINT64_MAX || ring == nullptr) return nullptr;
  detail::FlightRingRecord& r = detail::flight_ring_records(ring)[id % ring->capacity];
  // Overwritten entries are gone.
  return r.id == id && r.seq.load(std::memory_order_relaxed) != 0 &&
                 id < ring->next_id.load(std::memory_order_relaxed)
             ? &r
             : nullptr;
}

}  // namespace

uint64_t FlightRecorder::record(const std::string& group, const std::string& backend,
                                const std::string& op, uint64_t seq, bool p2p,
                                const std::string& detail) {
  if (!enabled_) return UINT64_MAX;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_ == nullptr) return UINT64_MAX;
  const uint64_t id = ring_->next_id.load(std::memory_order_relaxed);
  // Published first: a reader then skips the slot's previous entry, or finds the slot torn.
  ring_->next_id.store(id + 1, std::memory_order_release);
  detail::FlightRingRecord& r = detail::flight_ring_records(ring_)[id % ring_->capacity];
  RecordWrite write(r);
  r.id = id;
  detail::put_text(r.group, group);
  detail::put_text(r.backend, backend);
  detail::put_text(r.op, op);
  r.op_seq = seq;
  r.p2p = p2p ? 1 : 0;
  detail::put_text(r.detail, detail);
  r.enqueued_s = t;
  r.started_s = 0;
  r.ended_s = 0;
  r.state = static_cast<uint8_t>(State::kEnqueued);
  r.error[0] = '\0';
  return id;
}

void FlightRecorder::started(uint64_t id) {
  if (id == UINT64_MAX) return;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  if (detail::FlightRingRecord* r = find_record(ring_, id)) {
    RecordWrite write(*r);
    r->started_s = t;
    if (r->state == static_cast<uint8_t>(State::kEnqueued))
      r->state = static_cast<uint8_t>(State::kStarted);
  }
}

void FlightRecorder::ended(uint64_t id, const std::string& error) {
  if (id == UINT64_MAX) return;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  if (detail::FlightRingRecord* r = find_record(ring_, id)) {
    RecordWrite write(*r);
    if (r->started_s == 0) r->started_s = t;
    r->ended_s = t;
    r->state = static_cast<uint8_t>(error.empty() ? State::kCompleted : State::kFailed);
    detail::put_text(r->error, error);
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> out;
  if (ring_ == nullptr) return out;
  const uint64_t next_id = ring_->next_id.load(std::memory_order_relaxed);
  const uint64_t n = std::min<uint64_t>(next_id, ring_->capacity);
  const detail::FlightRingRecord* records = detail::flight_ring_records(ring_);
  for (uint64_t id = next_id - n; id < next_id; ++id)
    out.push_back(detail::entry_of(records[id % ring_->capacity]));
  return out;
}

std::string FlightRecorder::dump_path() const {
  const std::string job = env_or(launch::kEnvRunId, "job");
  const std::filesystem::path fallback = std::filesystem::temp_directory_path() / ("tandem-flight-" + job);
  const std::string dir = env_or(launch::kEnvFlightRecorderDir, fallback.string());
  return dir + "/flight_rank" + env_or(launch::kEnvRank, "0") + ".json";
}

std::string FlightRecorder::dump(const std::string& reason, std::string* error) const {
  if (!enabled_) {
    if (error != nullptr) *error = "the flight recorder is off (TANDEM_FLIGHT_RECORDER=0)";
    return "";
  }
  const std::string path = dump_path();
  FlightSnapshot snapshot;
  try {
    snapshot.rank = env_int(launch::kEnvRank, 0);
    snapshot.world_size = env_int(launch::kEnvWorldSize, 1);
    snapshot.pid = ::getpid();
    snapshot.entries = entries();
  } catch (const std::exception& e) {  // out of memory for the copy
    if (error != nullptr) *error = e.what();
    return "";
  }
  return write_flight_dump(snapshot, reason, path, error) ? path : "";
}

void FlightRecorder::install_signal_handler() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (signal_thread_ != nullptr || !enabled_) return;
  auto* t = new SignalThread;
  if (::pipe2(t->fds, O_CLOEXEC) != 0) {
    delete t;
    return;
  }
  signal_thread_ = t;
  g_signal_fd = t->fds[1];
  t->thread = std::thread([this, t] {
    pthread_setname_np(pthread_self(), "tandem-flight");
    for (;;) {
      char c = 0;
      const ssize_t n = ::read(t->fds[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || t->stop) return;
      std::string error;
      const std::string path = dump("signal", &error);
      std::fprintf(stderr, "tandem: flight recorder: %s\n",
                   path.empty() ? ("dump failed: " + error).c_str() : ("wrote " + path).c_str());
    }
  });
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigusr1;
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace tandem
