// How a worker process ended, and how tandemrun words it (exits, signals, durations).
#pragma once

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

}  // namespace tandem::launcher
