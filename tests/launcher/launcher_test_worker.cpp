// A tiny worker program for the tandemrun tests. Behaviour is chosen by the first argument (a
// CLI11 subcommand) and may depend on the RANK tandemrun gives it. Writes with write(2),
// unbuffered, so output reaches the launcher in the order the test expects. Every mode ends on
// its own within 60 s, so a bug in the launcher cannot leave processes behind for long.
//
//   env                     print the torchrun variables as KEY=VALUE (KEY=<unset> if missing)
//   args ARGS...            print each argument as arg[i]=... (all of them, verbatim)
//   print                   lines on stdout and stderr, an empty line, a long line, partial last
//                           lines
//   flood COUNT             COUNT numbered lines on stdout and on stderr
//   sleep                   print "ready pid=P", sleep 60 s
//   ignore-term             ignore SIGTERM, print "ready pid=P", sleep 60 s
//   handle-term             on SIGTERM/SIGINT print "rank R got signal S" and exit 0
//   fail-rank R CODE MS     rank R prints "dying words" (no newline), exits CODE after MS ms;
//                           others sleep
//   fail-once R CODE        prints the environment (like env); on restart 0 rank R exits CODE
//                           after 200 ms and the others sleep; on later restarts all exit 0
//   error-file R CODE TEXT  rank R writes TORCHELASTIC_ERROR_FILE (TorchElastic JSON, message
//                           "ValueError: TEXT at restart N") and exits CODE, on every restart;
//                           the others sleep
//   heartbeat R             beats (touches TANDEM_HEARTBEAT_FILE) every 50 ms for 1.5 s, exits
//                           0; on restart 0 rank R stops itself (SIGSTOP) after 300 ms
//   no-heartbeat MS         never beats, sleeps MS ms, exits 0
//   cascade P S             rank S writes a "tandem::CommError: ..." error file and exits 1 after
//                           100 ms; rank P writes "ValueError: the real cause" and exits 3
//                           after 600 ms (it failed first but takes longer to die); others sleep
// With TEST_IGNORE_TERM=1 set, any mode ignores SIGTERM. An unknown mode exits 64.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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

// Prints "ready pid=P", sleeps 60 s (a peer that waits to be stopped), returns `code`.
int sleep_then(int code) {
  ready();
  sleep_ms(60'000);
  return code;
}

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
                        "TANDEM_FT",
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
    return sleep_then(0);
  }
  put(1, "restart " + std::to_string(restart_count()) + " done\n");
  return 0;
}

// An error file as tandem::run_main writes it: `kind` as the launch contract spells it.
bool write_error(const std::string& message, const std::string& kind) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr) return false;
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  put(fd, "{\"message\": {\"message\": \"" + message +
              "\", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"" +
              std::to_string(std::time(nullptr)) + "\", \"kind\": \"" + kind +
              "\", \"restartable\": true}}}");
  ::close(fd);
  return true;
}

int cascade(int primary, int secondary) {
  if (rank() == secondary) {
    sleep_ms(100);
    write_error("tandem::CommError: allreduce failed: a peer rank probably died", "comm");
    return 1;
  }
  if (rank() == primary) {
    sleep_ms(600);
    write_error("ValueError: the real cause", "exception");
    return 3;
  }
  return sleep_then(0);
}

int error_file(int failing_rank, int code, const std::string& text) {
  if (rank() != failing_rank) return sleep_then(0);
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
  // Any mode: TEST_IGNORE_TERM=1 ignores SIGTERM (so stopping the group takes the grace period).
  if (std::getenv("TEST_IGNORE_TERM") != nullptr) ::signal(SIGTERM, SIG_IGN);
  CLI::App app("launcher_test_worker: a tiny worker program for the tandemrun tests");
  app.require_subcommand(1);
  int count = 0, failing = 0, code = 0, other = 0;
  long ms = 0;
  std::string text;
  auto* env = app.add_subcommand("env", "print the torchrun variables");
  auto* args = app.add_subcommand("args", "print each argument (all of them, verbatim)");
  args->prefix_command();
  auto* print = app.add_subcommand("print", "lines, an empty line, a long line, a partial last");
  auto* flood = app.add_subcommand("flood", "COUNT numbered lines on stdout and stderr");
  flood->add_option("count", count)->required();
  auto* sleep = app.add_subcommand("sleep", "print ready, sleep 60 s");
  auto* ignore_term = app.add_subcommand("ignore-term", "ignore SIGTERM, print ready, sleep");
  auto* handle_term = app.add_subcommand("handle-term", "report SIGTERM/SIGINT and exit 0");
  auto* fail_rank = app.add_subcommand("fail-rank", "rank R exits CODE after MS ms");
  fail_rank->add_option("rank", failing)->required();
  fail_rank->add_option("code", code)->required();
  fail_rank->add_option("ms", ms)->required();
  auto* fail_once_cmd = app.add_subcommand("fail-once", "on restart 0 rank R exits CODE");
  fail_once_cmd->add_option("rank", failing)->required();
  fail_once_cmd->add_option("code", code)->required();
  auto* error_file_cmd = app.add_subcommand("error-file", "rank R writes an error file, exits");
  error_file_cmd->add_option("rank", failing)->required();
  error_file_cmd->add_option("code", code)->required();
  error_file_cmd->add_option("text", text)->required();
  auto* cascade_cmd = app.add_subcommand("cascade", "a consequence exits before its cause");
  cascade_cmd->add_option("primary", failing)->required();
  cascade_cmd->add_option("secondary", other)->required();
  auto* heartbeat_cmd = app.add_subcommand("heartbeat", "beats; rank R stops itself");
  heartbeat_cmd->add_option("rank", failing)->required();
  auto* no_heartbeat = app.add_subcommand("no-heartbeat", "never beats, sleeps MS ms");
  no_heartbeat->add_option("ms", ms)->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 64;
  }
  if (*env) return print_env();
  if (*args) {
    std::string out;
    const std::vector<std::string> rest = args->remaining();
    for (std::size_t i = 0; i < rest.size(); ++i)
      out += "arg[" + std::to_string(i) + "]=" + rest[i] + "\n";
    put(1, out);
    return 0;
  }
  if (*print) return print_lines();
  if (*flood) return ::flood(count);
  if (*sleep) return sleep_then(0);
  if (*ignore_term) {
    ::signal(SIGTERM, SIG_IGN);
    return sleep_then(0);
  }
  if (*handle_term) return ::handle_term();
  if (*fail_rank) {
    if (rank() != failing) return sleep_then(0);
    sleep_ms(ms);
    put(2, "dying words");
    return code;
  }
  if (*fail_once_cmd) return fail_once(failing, code);
  if (*error_file_cmd) return error_file(failing, code, text);
  if (*cascade_cmd) return cascade(failing, other);
  if (*heartbeat_cmd) return heartbeat(failing);
  ready();
  sleep_ms(ms);  // no-heartbeat
  put(1, "done\n");
  return 0;
}
