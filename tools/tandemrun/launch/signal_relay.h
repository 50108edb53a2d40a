// Turns asynchronous signals into readable bytes on a pipe (the self-pipe trick), so tandemrun's
// single poll loop sees worker exits (SIGCHLD) and stop requests (SIGINT, SIGTERM, SIGHUP,
// SIGQUIT) together with worker output, without doing any work inside a signal handler.
#pragma once

#include <vector>

#include "tools/tandemrun/launch/fd_io.h"

namespace tandem::launcher {

// Signals tandemrun treats as "stop the run": forwarded to the workers, then exit 128+signal.
bool is_stop_signal(int signo);

// What arrived since the last drain().
struct ReceivedSignals {
  bool child_exited = false;      // at least one SIGCHLD
  std::vector<int> stop_signals;  // in arrival order
};

// Installs the handlers on construction and restores the previous dispositions on destruction.
// At most one instance may exist (the handlers write to a process-wide descriptor). Also ignores
// SIGPIPE so a closed stdout does not kill the launcher while workers still run.
class SignalRelay {
 public:
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Becomes readable when a signal arrived; poll it, then call drain().
  int fd() const { return read_.get(); }

  // Reads all pending notifications (never blocks).
  ReceivedSignals drain();

  // For a freshly forked child, before exec: restores default dispositions of every signal this
  // class touched and unblocks all signals. Async-signal-safe.
  static void reset_in_child();

 private:
  UniqueFd read_;
  UniqueFd write_;
};

}  // namespace tandem::launcher
