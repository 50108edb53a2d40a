// How a worker process ended, how tandemrun words it (exits, signals, durations), and the probes
// of a running one (heartbeat age, stopped). Thread-safe: plain functions of their arguments.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace tandem::launcher {

struct WorkerExit {
  bool signaled = false;  // killed by a signal rather than exiting
  int code = 0;           // exit code, or the signal number when `signaled`

  bool success() const { return !signaled && code == 0; }
};

// "SIGKILL", "SIGTERM", ...; "SIG<n>" for numbers without a name here.
std::string signal_name(int signo);

// "exited with code 3" / "was killed by signal 9 (SIGKILL)".
std::string describe(const WorkerExit& exit);

// "1.5 s" (shortest form of the number).
std::string seconds_text(double seconds);

// Seconds since `path` was last modified (a heartbeat file); nullopt while it does not exist.
std::optional<double> seconds_since_modified(const std::string& path);

// True when `pid` is stopped by a signal (SIGSTOP, SIGTSTP) or a debugger.
bool is_stopped(pid_t pid);

}  // namespace tandem::launcher
