// A tiny worker program for the tandemrun tests. Behaviour is chosen by the first argument and
// may depend on the RANK tandemrun gives it. Writes with write(2), unbuffered, so output reaches
// the launcher in the order the test expects. Every mode ends on its own within 60 s, so a bug
// in the launcher cannot leave processes behind for long.
//
//   env                       print the torchrun variables as KEY=VALUE (KEY=<unset> if missing)
//   args ARGS...              print each argument as arg[i]=...
//   print                     lines on stdout and stderr, an empty line, a long line, partial last
//   lines flood COUNT               COUNT numbered lines on stdout and on stderr sleep print "ready
//   pid=P", sleep 60 s ignore-term               ignore SIGTERM, print "ready pid=P", sleep 60 s
//   handle-term               on SIGTERM/SIGINT print "rank R got signal S" and exit 0
//   fail-rank R CODE MS       rank R prints "dying words" (no newline), exits CODE after MS ms;
//   others sleep
//   fail-once R CODE          prints the environment (like env); on restart 0 rank R exits CODE
//                             after 200 ms and the others sleep; on later restarts all exit 0
//   error-file R CODE TEXT    rank R writes TORCHELASTIC_ERROR_FILE (TorchElastic JSON, message
//                             "ValueError: TEXT at restart N") and exits CODE, on every restart;
//                             the others sleep
//   heartbeat R               beats (touches TANDEM_HEARTBEAT_FILE) every 50 ms for 1.5 s, exits
//                             0; on restart 0 rank R stops itself (SIGSTOP) after 300 ms
//   no-heartbeat MS           never beats, sleeps MS ms, exits 0
// With TEST_IGNORE_TERM=1 set, any mode ignores SIGTERM.
//   cascade P S               rank S writes a "tandem::CommError: ..." error file and exits 1 after
//                             100 ms; rank P writes "ValueError: the real cause" and exits 2
//                             after 600 ms (it failed first but takes longer to die); others sleep
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace {

volatile sig_atomic_t g_signal = 0;

void put(int fd, const std::string& text) {
  const char* data = text.data();
  std::size_t size = text.size();
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

int rank() {
  const char* r = std::getenv("RANK");
  return r != nullptr ? std::atoi(r) : -1;
}

void sleep_ms(long ms) {
  timespec t{ms / 1000, (ms % 1000) * 1'000'000L};
  while (::nanosleep(&t, &t) != 0 && errno == EINTR && g_signal == 0) {
  }
}

void ready() { put(1, "ready pid=" + std::to_string(::getpid()) + "\n"); }

extern "C" void on_signal(int signo) { g_signal = signo; }

int print_env() {
  const char* keys[] = {"RANK",
                        "LOCAL_RANK",
                        "WORLD_SIZE",
                        "LOCAL_WORLD_SIZE",
                        "GROUP_RANK",
                        "GROUP_WORLD_SIZE",
                        "ROLE_NAME",
                        "ROLE_RANK",
                        "ROLE_WORLD_SIZE",
                        "MASTER_ADDR",
                        "MASTER_PORT",
                        "TORCHELASTIC_RESTART_COUNT",
                        "TORCHELASTIC_MAX_RESTARTS",
                        "TORCHELASTIC_RUN_ID",
                        "TORCHELASTIC_USE_AGENT_STORE",
                        "OMP_NUM_THREADS",
                        "TORCHELASTIC_ERROR_FILE",
                        "TANDEM_HEARTBEAT_FILE",
                        "TANDEM_TEST_MARKER"};
  std::string out;
  for (const char* key : keys) {
    const char* value = std::getenv(key);
    out += std::string(key) + "=" + (value != nullptr ? value : "<unset>") + "\n";
  }
  put(1, out);
  return 0;
}

int print_lines() {
  const std::string r = std::to_string(rank());
  put(1, "out line 1\nout line 2\n");
  put(2, "err line 1\n");
  put(1, "\n");
  put(1, std::string(10000, 'x') + "\n");
  put(1, "partial-out-" + r);
  put(2, "partial-err-" + r);
  return 0;
}

int flood(int count) {
  const std::string r = std::to_string(rank());
  for (int i = 0; i < count; ++i) {
    put(1, "rank " + r + " out " + std::to_string(i) + "\n");
    put(2, "rank " + r + " err " + std::to_string(i) + "\n");
  }
  return 0;
}

int handle_term() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
  ready();
  for (int i = 0; i < 600 && g_signal == 0; ++i) sleep_ms(100);
  if (g_signal != 0)
    put(1, "rank " + std::to_string(rank()) + " got signal " + std::to_string(g_signal) + "\n");
  return 0;
}

int restart_count() {
  const char* r = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return r != nullptr ? std::atoi(r) : -1;
}

int fail_once(int failing_rank, int code) {
  print_env();
  if (restart_count() == 0) {
    if (rank() == failing_rank) {
      sleep_ms(200);
      return code;
    }
    ready();
    sleep_ms(60'000);
    return 0;
  }
  put(1, "restart " + std::to_string(restart_count()) + " done\n");
  return 0;
}

bool write_error(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr) return false;
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  put(fd, "{\"message\": {\"message\": \"" + message +
              "\", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"" +
              std::to_string(std::time(nullptr)) + "\"}}}");
  ::close(fd);
  return true;
}

int cascade(int primary, int secondary) {
  if (rank() == secondary) {
    sleep_ms(100);
    write_error("tandem::CommError: allreduce failed: a peer rank probably died");
    return 1;
  }
  if (rank() == primary) {
    sleep_ms(600);
    write_error("ValueError: the real cause");
    return 2;
  }
  ready();
  sleep_ms(60'000);
  return 0;
}

int error_file(int failing_rank, int code, const std::string& text) {
  if (rank() != failing_rank) {
    ready();
    sleep_ms(60'000);
    return 0;
  }
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr) return 99;
  // The exact shape torch.distributed.elastic's @record writes (json.dump of a dict).
  const std::string json = "{\"message\": {\"message\": \"ValueError: " + text + " at restart " +
                           std::to_string(restart_count()) +
                           "\", \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call "
                           "last):\\n  File \\\"train.py\\\", line 1\\n\", \"timestamp\": \"" +
                           std::to_string(std::time(nullptr)) + "\"}}}";
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 98;
  put(fd, json);
  ::close(fd);
  sleep_ms(100);
  return code;
}

void beat() {
  const char* path = std::getenv("TANDEM_HEARTBEAT_FILE");
  if (path == nullptr) return;
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ::futimens(fd, nullptr);
  ::close(fd);
}

int heartbeat(int hanging_rank) {
  ready();
  for (int i = 0; i < 30; ++i) {
    beat();
    if (restart_count() == 0 && rank() == hanging_rank && i == 6) {
      put(1, "stopping myself\n");
      ::raise(SIGSTOP);
    }
    sleep_ms(50);
  }
  put(1, "finished restart " + std::to_string(restart_count()) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  // Any mode: TEST_IGNORE_TERM=1 ignores SIGTERM (so stopping the group takes the grace period).
  if (std::getenv("TEST_IGNORE_TERM") != nullptr) ::signal(SIGTERM, SIG_IGN);
  if (mode == "env") return print_env();
  if (mode == "args") {
    std::string out;
    for (int i = 2; i < argc; ++i) out += "arg[" + std::to_string(i - 2) + "]=" + argv[i] + "\n";
    put(1, out);
    return 0;
  }
  if (mode == "print") return print_lines();
  if (mode == "flood" && argc > 2) return flood(std::atoi(argv[2]));
  if (mode == "sleep") {
    ready();
    sleep_ms(60'000);
    return 0;
  }
  if (mode == "ignore-term") {
    ::signal(SIGTERM, SIG_IGN);
    ready();
    sleep_ms(60'000);
    return 0;
  }
  if (mode == "handle-term") return handle_term();
  if (mode == "fail-rank" && argc > 4) {
    if (rank() == std::atoi(argv[2])) {
      sleep_ms(std::atol(argv[4]));
      put(2, "dying words");
      return std::atoi(argv[3]);
    }
    ready();
    sleep_ms(60'000);
    return 0;
  }
  if (mode == "fail-once" && argc > 3) return fail_once(std::atoi(argv[2]), std::atoi(argv[3]));
  if (mode == "error-file" && argc > 4)
    return error_file(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  if (mode == "cascade" && argc > 3) return cascade(std::atoi(argv[2]), std::atoi(argv[3]));
  if (mode == "heartbeat" && argc > 2) return heartbeat(std::atoi(argv[2]));
  if (mode == "no-heartbeat" && argc > 2) {
    ready();
    sleep_ms(std::atol(argv[2]));
    put(1, "done\n");
    return 0;
  }
  put(2, "launcher_test_worker: unknown mode '" + mode + "'\n");
  return 64;
}
