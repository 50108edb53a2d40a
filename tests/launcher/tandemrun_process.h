// Runs the real tandemrun binary from a test: fork + exec, stdout/stderr read through pipes,
// every wait bounded. Also small helpers to inspect worker processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tandem::launcher_test {

using namespace std::chrono_literals;

// Paths of the binaries under test: tandemrun (compiled into tandem_test_process).
std::string tandemrun_path();
#ifdef LAUNCHER_TEST_WORKER
// The worker program of the test executable that includes this header (its LAUNCHER_TEST_WORKER).
inline std::string worker_path() { return LAUNCHER_TEST_WORKER; }
#endif

// The test's own environment minus everything that would change what tandemrun or the workers
// do (OMP_NUM_THREADS, PET_*, torchrun variables), so results do not depend on the caller.
std::vector<std::string> clean_env();

struct RunResult {
  bool exited = false;  // exited normally (exit_code valid)
  int exit_code = -1;
  int term_signal = 0;  // when killed by a signal
  bool timed_out = false;
  std::string out;
  std::string err;
  double seconds = 0;  // from start to exit
};

class TandemrunProcess {
 public:
  // Starts `tandemrun args...`; with through_tandemrun = false, `args` is a whole command line
  // (args[0] the program), for tests that start workers directly.
  explicit TandemrunProcess(const std::vector<std::string>& args,
                            const std::vector<std::string>& env = clean_env(),
                            bool through_tandemrun = true);
  // SIGKILLs and reaps tandemrun if the test did not finish() it.
  ~TandemrunProcess();
  TandemrunProcess(const TandemrunProcess&) = delete;
  TandemrunProcess& operator=(const TandemrunProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

  // Reads output until `done()` is true; false if it is still false after `timeout` or at EOF.
  bool read_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);
  // Waits until stdout holds `count` occurrences of `needle`.
  bool wait_for_stdout_count(const std::string& needle, std::size_t count,
                             std::chrono::milliseconds timeout = 10s);

  void send(int signo);

  // Reads until both pipes close and tandemrun exits; SIGKILLs it after `timeout` (timed_out).
  RunResult finish(std::chrono::milliseconds timeout = 20s);

 private:
  void pump(int timeout_ms);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  std::string err_;
  std::chrono::steady_clock::time_point start_;
};

// A fresh directory under /tmp named after `tag`, removed with everything in it at destruction.
struct TempDir {
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

// Starts tandemrun with `args` and waits for it (bounded).
RunResult run_tandemrun(const std::vector<std::string>& args,
                        const std::vector<std::string>& env = clean_env(),
                        std::chrono::milliseconds timeout = 20s);

// A TCP port free on 127.0.0.1 right now (bound and released).
int free_loopback_port();

// The bytes of the file at `path`; empty when it cannot be read.
std::string read_file(const std::string& path);

std::vector<std::string> split_lines(const std::string& text);
std::size_t count_occurrences(const std::string& text, const std::string& needle);

// rank -> pid from "[rank R]: ready pid=P" lines.
std::map<int, pid_t> ready_pids(const std::string& out);
// rank -> pid from the summary lines "rank R (pid P) ...".
std::map<int, pid_t> summary_pids(const std::string& err);
// The directory tandemrun names in its "flight recorder: ... to DIR;" line, or "".
std::string flight_dump_dir(const std::string& err);

// True when `pid` no longer runs (absent, or a zombie) within `timeout`. Reaps it if it is our
// child (the SIGKILL test makes the test process a subreaper).
bool wait_until_gone(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace tandem::launcher_test
