// The flight recorder (include/tandem/collectives/flight_recorder.h).
#include <tandem/collectives/flight_recorder.h>

#include <tandem/base/file_system.h>

#include "base/json.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

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

const char* state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kEnqueued: return "enqueued";
    case FlightRecorder::State::kStarted: return "started";
    case FlightRecorder::State::kCompleted: return "completed";
    case FlightRecorder::State::kFailed: return "failed";
  }
  return "?";
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
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
  enabled_ = env_or("TANDEM_FLIGHT_RECORDER", "1") != "0";
  size_t capacity = 2048;
  if (const char* v = std::getenv("TANDEM_FLIGHT_RECORDER_ENTRIES")) {
    const long n = std::strtol(v, nullptr, 10);
    if (n > 0) capacity = static_cast<size_t>(n);
  }
  ring_.resize(capacity);
  reserve_strings();
}

// Every entry's text gets its room once, here, before training allocates anything: record() then
// copies into it without calling malloc. Strings allocated op by op lived for a whole ring's
// turn among each step's short-lived buffers and kept glibc's heap from shrinking (the main job's
// peak RSS grew 3-5% over 300 steps).
void FlightRecorder::reserve_strings() {
  constexpr size_t kTextBytes = 64;
  for (Entry& e : ring_) {
    for (std::string* text : {&e.group, &e.backend, &e.op, &e.detail}) text->reserve(kTextBytes);
  }
}

FlightRecorder::~FlightRecorder() {
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
  ring_.assign(capacity, Entry{});
  reserve_strings();
  next_id_ = 0;
  enabled_ = enabled;
}

uint64_t FlightRecorder::record(const std::string& group, const std::string& backend,
                                const std::string& op, uint64_t seq, bool p2p,
                                const std::string& detail) {
  if (!enabled_) return UINT64_MAX;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  Entry& e = ring_[id % ring_.size()];
  e.id = id;
  e.group.assign(group);  // into the reserved room (reserve_strings)
  e.backend.assign(backend);
  e.op.assign(op);
  e.seq = seq;
  e.p2p = p2p;
  e.detail.assign(detail);
  e.enqueued_s = t;
  e.started_s = 0;
  e.ended_s = 0;
  e.state = State::kEnqueued;
  e.error.clear();
  return id;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  if (id == UINT64_MAX || ring_.empty()) return nullptr;
  Entry& e = ring_[id % ring_.size()];
  return e.id == id && id < next_id_ ? &e : nullptr;  // overwritten entries are gone
}

void FlightRecorder::started(uint64_t id) {
  if (id == UINT64_MAX) return;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->started_s = t;
    if (e->state == State::kEnqueued) e->state = State::kStarted;
  }
}

void FlightRecorder::ended(uint64_t id, const std::string& error) {
  if (id == UINT64_MAX) return;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    if (e->started_s == 0) e->started_s = t;
    e->ended_s = t;
    e->state = error.empty() ? State::kCompleted : State::kFailed;
    e->error = error;
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> out;
  const uint64_t n = std::min<uint64_t>(next_id_, ring_.size());
  for (uint64_t id = next_id_ - n; id < next_id_; ++id) out.push_back(ring_[id % ring_.size()]);
  return out;
}

std::string FlightRecorder::dump_path() const {
  const std::string job = env_or("TORCHELASTIC_RUN_ID", "job");
  const std::filesystem::path fallback = std::filesystem::temp_directory_path() / ("tandem-flight-" + job);
  const std::string dir = env_or("TANDEM_FLIGHT_RECORDER_DIR", fallback.string());
  return dir + "/flight_rank" + env_or("RANK", "0") + ".json";
}

std::string FlightRecorder::dump(const std::string& reason, std::string* error) const {
  if (!enabled_) {
    if (error != nullptr) *error = "the flight recorder is off (TANDEM_FLIGHT_RECORDER=0)";
    return "";
  }
  const std::string path = dump_path();
  try {
    JsonValue doc = JsonValue::object();
    doc.set("format", "tandem-flight-recorder");
    doc.set("version", 1);
    doc.set("rank", static_cast<int64_t>(std::strtol(env_or("RANK", "0").c_str(), nullptr, 10)));
    doc.set("world_size", static_cast<int64_t>(std::strtol(env_or("WORLD_SIZE", "1").c_str(), nullptr, 10)));
    doc.set("pid", static_cast<int64_t>(::getpid()));
    doc.set("reason", reason);
    doc.set("dumped_at", now_s());
    JsonValue ops = JsonValue::array();
    for (const Entry& e : entries()) {
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
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    posix_file_system()->write_file_atomically(path, doc.dump(1) + "\n");
    return path;
  } catch (const std::exception& e) {
    if (error != nullptr) *error = e.what();
    return "";
  }
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
