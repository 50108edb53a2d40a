// tandem::run_main / tandem::heartbeat (include/tandem/runtime/run_main.h).
#include <tandem/runtime/run_main.h>

#include <tandem/base/errors.h>
#include <tandem/base/file_system.h>

#include "base/launch_contract.h"
#include "base/strings.h"
#include "runtime/error_report.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <typeinfo>

namespace tandem {
namespace {

// ---- fatal signals ----------------------------------------------------------------------------

constexpr int kFatalSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};
constexpr std::size_t kFatalCount = sizeof(kFatalSignals) / sizeof(kFatalSignals[0]);

// Prepared before fn runs; the handler only reads them.
char g_error_path[4096] = {};
bool g_have_error_path = false;

const char* fatal_name(int signo) {
  switch (signo) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default:
      return "SIG?";
  }
}

// Async-signal-safe appends into a fixed buffer.
struct SafeBuffer {
  char data[1024];
  std::size_t size = 0;
  void add(const char* text) {
    while (*text != '\0' && size + 1 < sizeof(data)) data[size++] = *text++;
  }
  void add_number(long long value) {
    char digits[24];
    int n = 0;
    bool negative = value < 0;
    unsigned long long v = negative ? 0ULL - static_cast<unsigned long long>(value)
                                    : static_cast<unsigned long long>(value);
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0 && n < 23);
    if (negative) add("-");
    while (n > 0) {
      const char digit[2] = {digits[--n], '\0'};
      add(digit);
    }
  }
};

extern "C" void tandem_on_fatal_signal(int signo) {
  const int saved_errno = errno;
  if (g_have_error_path) {
    SafeBuffer b;
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    b.add("{\"message\": {\"message\": \"Signal ");
    b.add_number(signo);
    b.add(" (");
    b.add(fatal_name(signo));
    b.add(") received by PID ");
    b.add_number(::getpid());
    b.add("\", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"");
    b.add_number(now.tv_sec);
    b.add("\", \"kind\": \"");
    b.add(launch::kind_name(launch::ErrorKind::kSignal));
    b.add("\", \"restartable\": true}}}\n");
    const int fd = ::open(g_error_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const ssize_t ignored = ::write(fd, b.data, b.size);
      (void)ignored;
      ::close(fd);
    }
  }
  errno = saved_errno;
  // SA_RESETHAND restored the default action and SA_NODEFER lets it through: die of the signal.
  ::raise(signo);
}

class FatalSignalHandlers {
 public:
  FatalSignalHandlers() {
    // An alternate stack so a stack overflow (SIGSEGV) can still be recorded.
    alt_stack_.reset(new char[kAltStackSize]);
    stack_t stack{};
    stack.ss_sp = alt_stack_.get();
    stack.ss_size = kAltStackSize;
    have_alt_stack_ = ::sigaltstack(&stack, &old_stack_) == 0;
    struct sigaction action {};
    action.sa_handler = tandem_on_fatal_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND | SA_NODEFER | (have_alt_stack_ ? SA_ONSTACK : 0);
    for (std::size_t i = 0; i < kFatalCount; ++i)
      installed_[i] = ::sigaction(kFatalSignals[i], &action, &previous_[i]) == 0;
  }
  ~FatalSignalHandlers() {
    for (std::size_t i = 0; i < kFatalCount; ++i) {
      if (installed_[i]) ::sigaction(kFatalSignals[i], &previous_[i], nullptr);
    }
    if (have_alt_stack_) ::sigaltstack(&old_stack_, nullptr);
  }
  FatalSignalHandlers(const FatalSignalHandlers&) = delete;
  FatalSignalHandlers& operator=(const FatalSignalHandlers&) = delete;

 private:
  static constexpr std::size_t kAltStackSize = 64 * 1024;
  std::unique_ptr<char[]> alt_stack_;
  stack_t old_stack_{};
  bool have_alt_stack_ = false;
  struct sigaction previous_[kFatalCount] = {};
  bool installed_[kFatalCount] = {};
};

// How long a rank whose error is a consequence of a peer's failure waits before it reports:
// longer than a failing process takes to exit, and more than the error file's 1 s resolution.
constexpr std::chrono::milliseconds kConsequenceDelay{2000};

// ---- heartbeat --------------------------------------------------------------------------------

constexpr std::int64_t kMinBeatIntervalNs = 100'000'000;  // 100 ms

struct HeartbeatChannel {
  int fd = -1;
  std::atomic<std::int64_t> last_ns{0};

  HeartbeatChannel() {
    const std::optional<std::string> path = launch::env(launch::kEnvHeartbeatFile);
    if (!path) return;
    // Creating the file is the first heartbeat (its mtime is now).
    fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    last_ns.store(now_ns(), std::memory_order_relaxed);
  }

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

namespace detail {

launch::ErrorReport error_report(const std::exception& e, const std::string& note) {
  using launch::ErrorKind;
  launch::ErrorReport r;
  r.message = strings::demangle(typeid(e).name()) + ": " + e.what();
  r.callstack = note + "\n" + r.message + "\n";
  r.timestamp = static_cast<long long>(std::time(nullptr));
  const auto* error = dynamic_cast<const Error*>(&e);
  r.restartable = error == nullptr || error->restartable();
  // Most derived first: a TimeoutError is a CommError too.
  if (error == nullptr) r.kind = ErrorKind::kException;
  else if (dynamic_cast<const ConfigError*>(&e)) r.kind = ErrorKind::kConfig;
  else if (dynamic_cast<const TimeoutError*>(&e)) r.kind = ErrorKind::kTimeout;
  else if (dynamic_cast<const PeerLostError*>(&e)) r.kind = ErrorKind::kPeerLost;
  else if (dynamic_cast<const CommError*>(&e)) r.kind = ErrorKind::kComm;
  else if (dynamic_cast<const CheckpointError*>(&e)) r.kind = ErrorKind::kCheckpoint;
  else if (dynamic_cast<const FileError*>(&e)) r.kind = ErrorKind::kFile;
  else if (dynamic_cast<const OutOfMemoryError*>(&e)) r.kind = ErrorKind::kOutOfMemory;
  else r.kind = ErrorKind::kError;
  return r;
}

bool write_error_report(const launch::ErrorReport& report) {
  const std::optional<std::string> path = launch::env(launch::kEnvErrorFile);
  if (!path) return false;
  try {
    // Atomically: the launcher never reads half a file.
    posix_file_system()->write_file_atomically(*path, launch::error_file_json(report));
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace detail

bool write_error_file(const std::string& message, const std::string& callstack) {
  launch::ErrorReport report;
  report.message = message;
  report.callstack = callstack;
  report.timestamp = static_cast<long long>(std::time(nullptr));
  report.kind = launch::ErrorKind::kError;
  return detail::write_error_report(report);
}

namespace {

// tandemrun --standby: this process was started ahead of a restart, has loaded the program and its
// libraries, and waits here for its worker environment: "KEY=VALUE" entries, each ended by NUL,
// then one more NUL, on the descriptor TANDEM_STANDBY_FD names. End of file first means the
// launcher did not need it: exit quietly. Acknowledged with one byte 'A' on the same descriptor
// (a socket) once set. Runs before anything reads the environment.
void await_standby_activation() {
  const long fd_number = launch::env_int(launch::kEnvStandbyFd, -1);
  if (fd_number < 0) return;
  const int fd = static_cast<int>(fd_number);
  ::unsetenv(launch::kEnvStandbyFd);
  std::string message;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    message.append(buffer, static_cast<size_t>(n));
    if (message.size() >= 2 && message.compare(message.size() - 2, 2, std::string(2, '\0')) == 0)
      break;
  }
  if (message.size() < 2 || message.compare(message.size() - 2, 2, std::string(2, '\0')) != 0)
    std::_Exit(0);  // not activated (or cut short): the launcher discarded this standby
  message.pop_back();
  for (size_t start = 0; start < message.size();) {
    const size_t end = message.find('\0', start);
    const std::string entry = message.substr(start, end - start);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && eq > 0)
      ::setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
    start = end + 1;
  }
  const ssize_t acked = ::write(fd, "A", 1);  // the launcher waits for this before it counts on us
  (void)acked;
  ::close(fd);
}

}  // namespace

int run_main(int argc, char** argv, const std::function<int(int, char**)>& fn) {
  await_standby_activation();
  const std::optional<std::string> path = launch::env(launch::kEnvErrorFile);
  g_have_error_path = false;
  if (path && path->size() < sizeof(g_error_path)) {
    std::strcpy(g_error_path, path->c_str());
    g_have_error_path = true;
  }
  FatalSignalHandlers handlers;
  constexpr const char* kNote = "C++ exception (no stack trace recorded)";
  launch::ErrorReport report;
  try {
    return fn(argc, argv);
  } catch (const std::exception& e) {
    report = detail::error_report(e, kNote);
  } catch (...) {
    report.message = strings::demangle(abi::__cxa_current_exception_type() != nullptr
                                           ? abi::__cxa_current_exception_type()->name()
                                           : nullptr) +
                     ": (not a std::exception)";
    report.callstack = std::string(kNote) + "\n" + report.message + "\n";
    report.timestamp = static_cast<long long>(std::time(nullptr));
  }
  const bool consequence = report.kind == launch::ErrorKind::kPeerLost;
  const std::string line = "tandem::run_main: uncaught exception: " + report.message + "\n";
  const ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
  // A lost peer usually failed first (not a timeout, not bad input). Under a launcher, report it a little later than that peer: torchrun names the
  // first process it sees exit (and, among several, the earliest error-file timestamp) as the
  // root cause, and this rank often notices the peer's death before the peer has finished exiting.
  if (consequence && g_have_error_path) std::this_thread::sleep_for(kConsequenceDelay);
  detail::write_error_report(report);
  return launch::kExitFailed;
}

void heartbeat() noexcept {
  static HeartbeatChannel channel;  // thread-safe initialisation; the first call opens the file
  if (channel.fd < 0) return;
  const std::int64_t now = HeartbeatChannel::now_ns();
  std::int64_t last = channel.last_ns.load(std::memory_order_relaxed);
  if (now - last < kMinBeatIntervalNs) return;
  if (!channel.last_ns.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  ::futimens(channel.fd, nullptr);  // mtime = now; failures show up as silence
}

}  // namespace tandem
