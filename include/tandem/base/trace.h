// Timeline recorder: spans, instants and counters of one process, written as Chrome-trace JSON
// (docs/timeline.md). `tandem-trace merge` / tandemrun --trace-dir join the ranks' files into one
// timeline that opens in Perfetto; `tandem-trace summary` turns it into compute / communication /
// overlap / bubble fractions.
//
//   tandem::trace::start(options.trace, rank);      // no-op unless options.enabled
//   { tandem::trace::Span span("forward", tandem::trace::kCompute); ... }
//   tandem::trace::stop();                           // writes <dir>/rank<R>.json
//
// Cost: while disabled every call is one relaxed atomic load and allocates nothing. While enabled
// each thread appends to a buffer of its own (registered with the recorder once per session; its
// mutex is only ever contended by stop()), so threads never serialise on a global lock. Events are
// packed into memory the recorder maps itself, never malloc's heap (kept there, they fragmented
// it and a training job's peak memory grew every step); stop() streams the file and unmaps them.
// Timestamps are CLOCK_REALTIME microseconds (a steady clock plus the wall offset taken at
// start()), so ranks in different processes line up when merged.
// Bounded: at most TraceOptions::max_events events per session; later ones are counted as
// dropped (written into the file's "otherData").
//
// Ownership: one recorder per process (a process-wide singleton). Thread-safety: every function
// may be called from any thread at any time; start()/stop() are serialised internally.
// Errors: start() throws ConfigError when a session is already running or the options are bad;
// stop() throws Error naming the file when it cannot be written (the events are dropped).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem {

// Options of a recording session. Plain values: the config system (docs/config.md) fills them
// under the keys named beside each field; nothing here reads the environment.
struct TraceOptions {
  bool enabled = false;           // trace.enabled: record spans to Chrome-trace JSON
  std::string dir = "trace";      // trace.dir: each rank writes <dir>/rank<R>.json
  bool allocator_events = false;  // trace.allocator_events: also record allocator counters
  int64_t max_events = 1000000;   // trace.max_events: events kept per process; later ones dropped
  bool nvtx = false;              // trace.nvtx: also NVTX ranges for Nsight Systems (CUDA builds)
};

}  // namespace tandem

namespace tandem::trace {

// Categories the summary classifies (tandem-trace summary, docs/timeline.md).
inline constexpr const char* kCompute = "compute";        // forward, backward, pipeline F/B/W
inline constexpr const char* kComm = "comm";              // collectives, bucket reduce, send/recv
inline constexpr const char* kCodec = "codec";            // compression stages (counted as comm)
inline constexpr const char* kWait = "wait";              // blocked on communication
inline constexpr const char* kPipeline = "pipeline";      // a pipeline step: idle inside = bubble
inline constexpr const char* kCheckpoint = "checkpoint";  // snapshot, write, commit
inline constexpr const char* kMemory = "memory";          // allocator counters

namespace detail {
extern std::atomic<bool> g_enabled;
extern std::atomic<bool> g_nvtx;
}  // namespace detail

// True while a session records. One relaxed load.
inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }

// NVTX ranges (Nsight Systems): on when trace.nvtx asked for them in a build with the NVTX headers
// (the CUDA toolkit's header-only nvtx3; nothing is linked, and without a profiler attached each
// range is a no-op call). Off, each site costs one relaxed load.
inline bool nvtx() noexcept { return detail::g_nvtx.load(std::memory_order_relaxed); }
// Whether this build has NVTX.
bool nvtx_available() noexcept;
// A process-wide range (may end on another thread); 0 when NVTX is off.
uint64_t nvtx_start(const char* name) noexcept;
void nvtx_end(uint64_t id) noexcept;

// Starts a session writing to `options.dir`/rank<rank>.json at stop(). Does nothing when
// options.enabled is false (but for switching NVTX ranges on or off, per options.nvtx). Creates the
// directory. Throws ConfigError when a session is already running, rank < 0, max_events < 1, the
// directory cannot be created, or options.nvtx in a build without NVTX.
void start(const TraceOptions& options, int rank);

// Ends the session and writes its file; returns the path written ("" when no session ran).
// Spans still open on other threads are not recorded.
std::string stop();

// Whether the session also records allocator counters (trace.allocator_events).
bool allocator_events() noexcept;

// Microseconds since the Unix epoch, from a steady clock (monotonic within the process).
int64_t now_us() noexcept;
int64_t to_us(std::chrono::steady_clock::time_point t) noexcept;

// Event arguments as a JSON object body, built only when recording.
class Args {
 public:
  Args& add(std::string_view key, std::string_view value);
  Args& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  Args& add(std::string_view key, const std::string& value) {
    return add(key, std::string_view(value));
  }
  Args& add(std::string_view key, double value);
  template <class T, class = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
  Args& add(std::string_view key, T value) {
    return add_int(key, static_cast<int64_t>(value));
  }
  const std::string& body() const { return body_; }  // `"k":v,"k2":v2`
  bool empty() const { return body_.empty(); }

 private:
  Args& add_int(std::string_view key, int64_t value);
  void key(std::string_view k);
  std::string body_;
};

// A complete event ("ph":"X") from begin_us to end_us on the calling thread.
void complete(std::string_view name, const char* category, int64_t begin_us, int64_t end_us,
              const Args& args = {});
// An async span ("ph":"b"/"e", one track per id) for work that does not nest on one thread, such
// as a gradient bucket's reduce from launch to completion.
void async_span(std::string_view name, const char* category, uint64_t id, int64_t begin_us,
                int64_t end_us, const Args& args = {});
// A point in time ("ph":"i", thread scope).
void instant(std::string_view name, const char* category, const Args& args = {});
// A counter sample ("ph":"C"): every numeric arg becomes one series of the counter `name`.
void counter(std::string_view name, const Args& values);

// Scoped span on the calling thread: recorded at destruction when a session was running at
// construction. Add arguments with arg() (ignored while disabled).
class Span {
 public:
  Span(const char* name, const char* category) noexcept
      : active_(enabled()), name_(name), category_(category), begin_us_(active_ ? now_us() : 0),
        nvtx_(nvtx() ? nvtx_start(name) : 0) {}
  ~Span() {
    if (active_ || nvtx_ != 0) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  template <class T>
  Span& arg(std::string_view key, T&& value) {
    if (active_) args_.add(key, std::forward<T>(value));
    return *this;
  }
  // Records now instead of at destruction.
  void end();

 private:
  bool active_;
  const char* name_;
  const char* category_;
  int64_t begin_us_;
  uint64_t nvtx_;  // its NVTX range (0: none)
  Args args_;
};

// What the current (or last) session recorded, for tests and the file's metadata.
struct Stats {
  int64_t recorded = 0;
  int64_t dropped = 0;
};
Stats stats();

}  // namespace tandem::trace
