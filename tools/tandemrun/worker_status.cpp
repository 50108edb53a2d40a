#include "tools/tandemrun/worker_status.h"

#include <signal.h>

#include <sstream>

namespace tandem::launcher {

std::string signal_name(int signo) {
  // A table rather than sigabbrev_np(): that is glibc-only and new (2.32).
  struct Named {
    int signo;
    const char* name;
  };
  static constexpr Named kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  };
  for (const auto& n : kNames) {
    if (n.signo == signo) return n.name;
  }
  return "SIG" + std::to_string(signo);
}

std::string describe(const WorkerExit& exit) {
  if (exit.signaled) {
    return "was killed by signal " + std::to_string(exit.code) + " (" + signal_name(exit.code) +
           ")";
  }
  return "exited with code " + std::to_string(exit.code);
}

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds << " s";
  return text.str();
}

}  // namespace tandem::launcher
