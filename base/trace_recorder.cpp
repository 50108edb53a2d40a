// The timeline recorder (include/tandem/base/trace.h): per-thread buffers of packed records in
// mapped memory, Chrome-trace output through base/chrome_trace.h.
#include <tandem/base/errors.h>
#include <tandem/base/trace.h>

#include "base/chrome_trace.h"
#include "base/json.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

namespace tandem::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

// One event, packed into a block: this header, then its name, then its args text.
struct Record {
  int64_t ts;
  int64_t dur;
  uint64_t id;
  const char* category;
  uint32_t name_size;
  uint32_t args_size;
  char ph;

  const char* text() const { return reinterpret_cast<const char*>(this + 1); }
  std::string_view name() const { return {text(), name_size}; }
  std::string_view args() const { return {text() + name_size, args_size}; }
  size_t bytes() const { return padded(sizeof(Record) + name_size + args_size); }
  static size_t padded(size_t n) { return (n + alignof(Record) - 1) & ~(alignof(Record) - 1); }
};

// Records in memory mapped straight from the kernel, never taken from malloc. Events live until
// stop(); in malloc's heap they sat between the short-lived tensors of every training step, so
// glibc could not reuse the holes those left and the heap grew each step (docs/timeline.md,
// "Memory"). A block's pages become resident only as records fill them.
struct Block {
  static constexpr size_t kBytes = size_t{1} << 20;
  Block* next;
  size_t capacity;  // bytes mapped, this header included
  size_t used;

  static Block* map(size_t record_bytes) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t want = std::max(kBytes, sizeof(Block) + record_bytes);
    const size_t bytes = (want + page - 1) / page * page;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    return new (p) Block{nullptr, bytes, Record::padded(sizeof(Block))};
  }
  char* base() { return reinterpret_cast<char*>(this); }
};

struct ThreadBuffer {
  std::mutex mutex;  // contended only by stop()
  Block* head = nullptr;
  Block* tail = nullptr;
  int64_t tid = 0;
  std::string thread_name;

  ~ThreadBuffer() { release(); }

  // Copies the event in; false when no memory could be mapped for it.
  bool append(char ph, const char* category, std::string_view name, int64_t ts, int64_t dur,
              uint64_t id, std::string_view args) {
    const size_t bytes = Record::padded(sizeof(Record) + name.size() + args.size());
    if (tail == nullptr || tail->capacity - tail->used < bytes) {
      Block* block = Block::map(bytes);
      if (block == nullptr) return false;
      (tail != nullptr ? tail->next : head) = block;
      tail = block;
    }
    char* at = tail->base() + tail->used;
    new (at) Record{ts, dur, id, category, static_cast<uint32_t>(name.size()),
                    static_cast<uint32_t>(args.size()), ph};
    std::memcpy(at + sizeof(Record), name.data(), name.size());
    std::memcpy(at + sizeof(Record) + name.size(), args.data(), args.size());
    tail->used += bytes;
    return true;
  }

  template <class Fn>
  void for_each(Fn&& fn) const {
    for (Block* b = head; b != nullptr; b = b->next) {
      for (size_t at = Record::padded(sizeof(Block)); at < b->used;) {
        const auto* r = reinterpret_cast<const Record*>(b->base() + at);
        fn(*r);
        at += r->bytes();
      }
    }
  }

  // Unmaps every block: the thread's slot may keep this buffer alive after its session.
  void release() {
    while (head != nullptr) {
      Block* next = head->next;
      ::munmap(head, head->capacity);
      head = next;
    }
    tail = nullptr;
  }
};

struct Session {
  uint64_t generation = 0;
  int rank = 0;
  std::string dir;
  bool allocator_events = false;
  int64_t max_events = 0;
};

std::mutex g_session_mutex;  // start/stop and buffer registration (once per thread per session)
Session g_session;
std::vector<std::shared_ptr<ThreadBuffer>> g_buffers;
std::atomic<uint64_t> g_generation{0};
std::atomic<int64_t> g_count{0};  // events claimed this session (recorded + dropped)
std::atomic<int64_t> g_unmapped{0};  // claimed, but no memory could be mapped for them
std::atomic<int64_t> g_max{0};
std::atomic<bool> g_allocator_events{false};

int64_t steady_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

int64_t wall_offset_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t wall = static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  return wall - steady_us(std::chrono::steady_clock::now());
}

std::atomic<int64_t> g_wall_offset{wall_offset_now()};

struct ThreadSlot {
  uint64_t generation = 0;
  std::shared_ptr<ThreadBuffer> buffer;
};
thread_local ThreadSlot t_slot;

// The calling thread's buffer for the running session (registered on first use).
ThreadBuffer* buffer_for_this_thread() {
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (t_slot.generation == generation && t_slot.buffer) return t_slot.buffer.get();
  auto buffer = std::make_shared<ThreadBuffer>();
  buffer->tid = static_cast<int64_t>(::syscall(SYS_gettid));
  char name[64] = {0};
  if (pthread_getname_np(pthread_self(), name, sizeof name) == 0) buffer->thread_name = name;
  std::lock_guard<std::mutex> lock(g_session_mutex);
  if (g_session.generation != generation) return nullptr;  // the session ended meanwhile
  g_buffers.push_back(buffer);
  t_slot.generation = generation;
  t_slot.buffer = std::move(buffer);
  return t_slot.buffer.get();
}

// Claims room for one event; false (and counted as dropped) over the cap.
bool claim() {
  return g_count.fetch_add(1, std::memory_order_relaxed) < g_max.load(std::memory_order_relaxed);
}

void record(char ph, const char* category, std::string_view name, int64_t ts, int64_t dur,
            uint64_t id, std::string_view args) {
  if (!enabled() || !claim()) return;
  ThreadBuffer* buffer = buffer_for_this_thread();
  if (buffer == nullptr) return;
  std::lock_guard<std::mutex> lock(buffer->mutex);
  if (!buffer->append(ph, category, name, ts, dur, id, args)) {
    g_unmapped.fetch_add(1, std::memory_order_relaxed);
  }
}

// Writes the session as Chrome-trace JSON (base/chrome_trace.h) to `f` in pieces of about 1 MiB:
// a full session (a million events, ~150 MB of text) is never held twice. False on a write error.
bool render(std::FILE* f, const Session& session,
            const std::vector<std::shared_ptr<ThreadBuffer>>& buffers, int64_t recorded,
            int64_t dropped) {
  ChromeTraceWriter writer;
  std::string& out = writer.text();
  bool ok = true;
  auto flush = [&](size_t at_least) {
    if (out.size() < at_least) return;
    ok = ok && std::fwrite(out.data(), 1, out.size(), f) == out.size();
    out.clear();
  };
  const int rank = session.rank;
  writer.metadata("process_name", rank, 0, Args().add("name", "rank " + std::to_string(rank)).body());
  writer.metadata("process_sort_index", rank, 0, Args().add("sort_index", rank).body());
  for (const auto& buffer : buffers) {
    std::lock_guard<std::mutex> lock(buffer->mutex);
    const std::string thread_name = buffer->thread_name.empty()
                                        ? "thread " + std::to_string(buffer->tid)
                                        : buffer->thread_name;
    writer.metadata("thread_name", rank, buffer->tid, Args().add("name", thread_name).body());
    buffer->for_each([&](const Record& r) {
      ChromeTraceEvent e;
      e.name = r.name();
      e.category = r.category != nullptr ? r.category : "";
      e.phase = r.ph;
      e.ts_us = static_cast<double>(r.ts);
      e.pid = rank;
      e.tid = buffer->tid;
      e.dur_us = static_cast<double>(r.dur);
      e.id = r.id;
      e.args = r.args();
      writer.event(e);
      flush(size_t{1} << 20);
    });
  }
  JsonValue other = JsonValue::object();
  other.set("tandem_trace_version", JsonValue(1));
  other.set("rank", JsonValue(rank));
  other.set("recorded_events", JsonValue(recorded));
  other.set("dropped_events", JsonValue(dropped));
  other.set("clock", JsonValue("CLOCK_REALTIME microseconds"));
  writer.finish(other);
  flush(0);
  return ok;
}

void make_directories(const std::string& dir) {
  std::string path;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    path = dir.substr(0, pos);
    if (path.empty()) continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      throw ConfigError("tandem: trace: cannot create the trace directory '" + dir + "' (at '" +
                        path + "': " + std::strerror(errno) +
                        "). Set trace.dir to a writable directory.");
    }
  }
}

// Writes through a temporary name and a rename, so a reader never sees half a file.
template <class Write>
void write_file(const std::string& path, Write&& write) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  bool ok = f != nullptr && write(f);
  if (f != nullptr) ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error("tandem: trace: cannot write the timeline '" + path + "' (" + std::strerror(err) +
                "); its events are lost. Check free space and permissions of trace.dir.");
  }
}

}  // namespace

void start(const TraceOptions& options, int rank) {
  if (options.nvtx && !nvtx_available()) {
    throw ConfigError("tandem: trace.nvtx needs a tandem built with the CUDA toolkit (its nvtx3 headers); "
                      "--set trace.nvtx=false, or rebuild where CUDA is installed.");
  }
  detail::g_nvtx.store(options.nvtx, std::memory_order_release);
  if (!options.enabled) return;
  if (rank < 0) {
    throw ConfigError("tandem: trace::start(): rank " + std::to_string(rank) +
                      " is negative; pass this process's rank (RANK).");
  }
  if (options.max_events < 1) {
    throw ConfigError("tandem: trace.max_events must be at least 1 (got " +
                      std::to_string(options.max_events) + ").");
  }
  if (options.dir.empty()) {
    throw ConfigError("tandem: trace.dir is empty; name the directory the timeline goes to.");
  }
  std::lock_guard<std::mutex> lock(g_session_mutex);
  if (enabled()) {
    throw ConfigError("tandem: trace::start() called while a session (rank " +
                      std::to_string(g_session.rank) + ", dir '" + g_session.dir +
                      "') is running; call trace::stop() first (one recorder per process).");
  }
  make_directories(options.dir);
  g_wall_offset.store(wall_offset_now(), std::memory_order_relaxed);
  g_session.generation = g_generation.load() + 1;
  g_session.rank = rank;
  g_session.dir = options.dir;
  g_session.allocator_events = options.allocator_events;
  g_session.max_events = options.max_events;
  g_buffers.clear();
  g_count.store(0);
  g_unmapped.store(0);
  g_max.store(options.max_events);
  g_allocator_events.store(options.allocator_events);
  g_generation.store(g_session.generation, std::memory_order_release);
  detail::g_enabled.store(true, std::memory_order_release);
}

std::string stop() {
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  Session session;
  {
    std::lock_guard<std::mutex> lock(g_session_mutex);
    if (!enabled()) return "";
    detail::g_enabled.store(false, std::memory_order_release);
    g_allocator_events.store(false);
    session = g_session;
    buffers.swap(g_buffers);
    g_session.generation = 0;  // buffers registering late are refused
  }
  const Stats s = stats();
  const std::string path = session.dir + "/rank" + std::to_string(session.rank) + ".json";
  auto release = [&buffers] {  // threads' slots may keep their buffers: keep no events there
    for (const auto& buffer : buffers) {
      std::lock_guard<std::mutex> lock(buffer->mutex);
      buffer->release();
    }
  };
  try {
    write_file(path, [&](std::FILE* f) { return render(f, session, buffers, s.recorded, s.dropped); });
  } catch (...) {
    release();
    throw;
  }
  release();
  return path;
}

bool allocator_events() noexcept {
  return enabled() && g_allocator_events.load(std::memory_order_relaxed);
}

int64_t to_us(std::chrono::steady_clock::time_point t) noexcept {
  return steady_us(t) + g_wall_offset.load(std::memory_order_relaxed);
}

int64_t now_us() noexcept { return to_us(std::chrono::steady_clock::now()); }

void Args::key(std::string_view k) {
  if (!body_.empty()) body_ += ',';
  append_json_string(body_, k);
  body_ += ':';
}

Args& Args::add(std::string_view k, std::string_view value) {
  key(k);
  append_json_string(body_, value);
  return *this;
}

Args& Args::add(std::string_view k, double value) {
  key(k);
  if (!std::isfinite(value)) {
    body_ += "null";  // JSON has no NaN/Infinity
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    body_ += buf;
  }
  return *this;
}

Args& Args::add_int(std::string_view k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

void complete(std::string_view name, const char* category, int64_t begin_us, int64_t end_us,
              const Args& args) {
  if (!enabled()) return;
  record('X', category, name, begin_us, end_us > begin_us ? end_us - begin_us : 0, 0, args.body());
}

void async_span(std::string_view name, const char* category, uint64_t id, int64_t begin_us,
                int64_t end_us, const Args& args) {
  if (!enabled()) return;
  record('b', category, name, begin_us, 0, id, args.body());
  record('e', category, name, std::max(begin_us, end_us), 0, id, {});
}

void instant(std::string_view name, const char* category, const Args& args) {
  if (!enabled()) return;
  record('i', category, name, now_us(), 0, 0, args.body());
}

void counter(std::string_view name, const Args& values) {
  if (!enabled()) return;
  record('C', kMemory, name, now_us(), 0, 0, values.body());
}

void Span::end() {
  if (nvtx_ != 0) {
    nvtx_end(nvtx_);
    nvtx_ = 0;
  }
  if (!active_) return;
  active_ = false;
  complete(name_, category_, begin_us_, now_us(), args_);
}

Stats stats() {
  Stats s;
  const int64_t claimed = g_count.load();
  const int64_t cap = g_max.load();
  const int64_t unmapped = g_unmapped.load();
  s.recorded = std::min(claimed, cap) - unmapped;
  s.dropped = (claimed > cap ? claimed - cap : 0) + unmapped;
  return s;
}

}  // namespace tandem::trace
