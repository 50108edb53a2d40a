// Reading a flight-recorder ring from outside its process, and writing dumps
// (include/tandem/collectives/flight_ring.h). Torch-free: tandemrun compiles it too.
#include <tandem/collectives/flight_ring.h>

#include <tandem/base/errors.h>
#include <tandem/base/file_system.h>

#include "base/json.h"
#include "collectives/flight_ring_layout.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace tandem {

namespace {

const char* state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kEnqueued: return "enqueued";
    case FlightRecorder::State::kStarted: return "started";
    case FlightRecorder::State::kCompleted: return "completed";
    case FlightRecorder::State::kFailed: return "failed";
  }
  return "?";
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A read-only mapping, unmapped when it goes.
struct Mapping {
  void* data = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (data != MAP_FAILED) ::munmap(data, size);
  }
};

// One record copied out under its seqlock; false when it stayed torn over a few tries (a
// stopped process never finishes the write: one try would do; a running one may be mid-write).
bool read_record(const detail::FlightRingRecord& r, FlightRecorder::Entry* out,
                 uint64_t* seq_seen) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const uint64_t before = r.seq.load(std::memory_order_acquire);
    *seq_seen = before;
    if (before == 0) return true;  // never written
    if (before % 2 == 1) continue;
    FlightRecorder::Entry e = detail::entry_of(r);
    const uint8_t state = r.state;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.seq.load(std::memory_order_relaxed) != before) continue;
    if (state > static_cast<uint8_t>(FlightRecorder::State::kFailed)) return false;
    *out = std::move(e);
    return true;
  }
  return false;
}

}  // namespace

bool write_flight_dump(const FlightSnapshot& s, const std::string& reason, const std::string& path,
                       std::string* error) {
  try {
    JsonValue doc = JsonValue::object();
    doc.set("format", "tandem-flight-recorder");
    doc.set("version", 1);
    doc.set("rank", static_cast<int64_t>(s.rank));
    doc.set("world_size", static_cast<int64_t>(s.world_size));
    doc.set("pid", s.pid);
    doc.set("reason", reason);
    doc.set("dumped_at", now_s());
    JsonValue ops = JsonValue::array();
    for (const FlightRecorder::Entry& e : s.entries) {
      JsonValue o = JsonValue::object();
      o.set("id", e.id);
      o.set("group", e.group);
      o.set("backend", e.backend);
      o.set("op", e.op);
      o.set("seq", e.seq);
      o.set("p2p", e.p2p);
      o.set("detail", e.detail);
      o.set("state", state_name(e.state));
      o.set("enqueued_s", e.enqueued_s);
      o.set("started_s", e.started_s);
      o.set("ended_s", e.ended_s);
      if (!e.error.empty()) o.set("error", e.error);
      ops.push_back(std::move(o));
    }
    doc.set("ops", std::move(ops));
    if (!s.torn.empty()) {
      JsonValue torn = JsonValue::array();
      for (const uint64_t slot : s.torn) torn.push_back(slot);
      doc.set("torn", std::move(torn));  // ring slots being written when read: left out of "ops"
    }
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    posix_file_system()->write_file_atomically(path, doc.dump(1) + "\n");
    return true;
  } catch (const std::exception& e) {
    if (error != nullptr) *error = e.what();
    return false;
  }
}

std::string find_flight_ring(pid_t pid) {
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  const std::string want = std::string("/memfd:") + detail::kFlightRingName + " (deleted)";
  std::string found;
  if (DIR* d = ::opendir(fds.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string fd = fds + "/" + e->d_name;
      char target[256];
      const ssize_t n = ::readlink(fd.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      if (std::string(target, static_cast<size_t>(n)) == want) {
        found = fd;
        break;
      }
    }
    ::closedir(d);
  }
  return found;
}

FlightSnapshot read_flight_ring(const std::string& path) {
  const auto fail = [&](const std::string& what) {
    return Error("flight recorder: " + path + " is not a readable flight-recorder ring: " + what);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(std::strerror(errno));
  struct stat st {};
  const int stat_rc = ::fstat(fd, &st);
  Mapping m;
  if (stat_rc == 0 && static_cast<size_t>(st.st_size) >= sizeof(detail::FlightRingHeader)) {
    m.size = static_cast<size_t>(st.st_size);
    m.data = ::mmap(nullptr, m.size, PROT_READ, MAP_SHARED, fd, 0);
  }
  const int map_errno = errno;
  ::close(fd);
  if (stat_rc != 0 || m.size == 0) throw fail("shorter than its header");
  if (m.data == MAP_FAILED) throw fail(std::string("mmap: ") + std::strerror(map_errno));
  auto* h = static_cast<detail::FlightRingHeader*>(m.data);
  if (std::memcmp(h->magic, detail::kFlightRingMagic, sizeof h->magic) != 0)
    throw fail("no ring header");
  if (h->version != detail::kFlightRingVersion ||
      h->record_size != sizeof(detail::FlightRingRecord)) {
    throw fail("version " + std::to_string(h->version) + " with " + std::to_string(h->record_size) +
               "-byte records; this reader knows version " +
               std::to_string(detail::kFlightRingVersion) + " with " +
               std::to_string(sizeof(detail::FlightRingRecord)) + "-byte records");
  }
  if (h->capacity == 0 || detail::flight_ring_bytes(h->capacity) > m.size) {
    throw fail("its capacity (" + std::to_string(h->capacity) + " records) does not fit its " +
               std::to_string(m.size) + " bytes");
  }
  FlightSnapshot s;
  s.rank = h->rank;
  s.world_size = h->world_size;
  s.pid = h->pid;
  const uint64_t next_id = h->next_id.load(std::memory_order_acquire);
  const uint64_t first = next_id > h->capacity ? next_id - h->capacity : 0;
  const detail::FlightRingRecord* records = detail::flight_ring_records(h);
  for (uint64_t slot = 0; slot < h->capacity; ++slot) {
    FlightRecorder::Entry e;
    uint64_t seq = 0;
    if (!read_record(records[slot], &e, &seq)) {
      s.torn.push_back(slot);
    } else if (seq != 0 && e.id >= first && e.id < next_id) {
      s.entries.push_back(std::move(e));
    }
  }
  std::sort(
      s.entries.begin(), s.entries.end(),
      [](const FlightRecorder::Entry& a, const FlightRecorder::Entry& b) { return a.id < b.id; });
  return s;
}

}  // namespace tandem
