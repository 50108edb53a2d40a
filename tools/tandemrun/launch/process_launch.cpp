#include "tools/tandemrun/launch/process_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <tandem/base/errors.h>

#include "tools/tandemrun/launch/signal_relay.h"

namespace tandem::launcher {
namespace {

// What a child reports through its close-on-exec status pipe when it cannot exec the program.
enum ChildStage : int { kSetpgid, kDeathSignal, kParentCheck, kDup2, kExec, kStageCount };
constexpr const char* kStageNames[kStageCount] = {"setpgid", "prctl(PR_SET_PDEATHSIG)",
                                                  "parent check (launcher gone)", "dup2", "execve"};
struct ChildFailure {
  int stage;  // a ChildStage
  int error;  // errno
};

[[noreturn]] void child_fail(int status_fd, int stage, int error) {
  const ChildFailure failure{stage, error};
  const ssize_t ignored = ::write(status_fd, &failure, sizeof(failure));
  (void)ignored;
  ::_exit(127);
}

// Runs in the forked child: only async-signal-safe calls until execve().
[[noreturn]] void exec_child(pid_t parent, int stdin_fd, int stdout_fd, int stderr_fd,
                             int status_fd, int keep_fd, const char* path, char* const* argv,
                             char* const* envp) {
  SignalRelay::reset_in_child();
  if (::setpgid(0, 0) != 0) child_fail(status_fd, kSetpgid, errno);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(status_fd, kDeathSignal, errno);
  // If the launcher died before prctl() took effect, the death signal will never come.
  if (::getppid() != parent) child_fail(status_fd, kParentCheck, ESRCH);
  if (::dup2(stdin_fd, 0) < 0 || ::dup2(stdout_fd, 1) < 0 || ::dup2(stderr_fd, 2) < 0) {
    child_fail(status_fd, kDup2, errno);
  }
  if (keep_fd >= 0 && ::fcntl(keep_fd, F_SETFD, 0) != 0) child_fail(status_fd, kDup2, errno);
  ::execve(path, argv, envp);
  child_fail(status_fd, kExec, errno);
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

LaunchedProcess launch_process(LaunchSpec spec) {
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  Pipe status = make_pipe();

  // Block signals across fork() so no handler of ours runs in the child (it would write to the
  // launcher's signal pipe); the child restores defaults and unblocks before exec.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &previous);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    exec_child(parent, spec.stdin_fd, out.write.get(), err.write.get(), status.write.get(),
               spec.keep_fd, spec.path.c_str(), argv.data(), envp.data());
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw Error("cannot start " + spec.who + ": fork() failed: " + std::strerror(fork_errno) +
                "; too many processes? check `ulimit -u`");
  }
  ::setpgid(pid, pid);  // the child does the same; doing it here too closes the race with killpg()
  out.write.reset();
  err.write.reset();
  status.write.reset();

  // End-of-file on the status pipe means execve() succeeded (the pipe is close-on-exec).
  ChildFailure failure{};
  ssize_t n;
  do {
    n = ::read(status.read.get(), &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(failure))) {
    ::waitpid(pid, nullptr, 0);  // it has _exit()ed
    const int stage = std::clamp(failure.stage, 0, kStageCount - 1);
    const bool missing_interpreter = stage == kExec && failure.error == ENOENT;
    throw Error(
        "cannot start " + spec.who + " ('" + spec.path + "'): " + kStageNames[stage] +
        " failed: " + std::strerror(failure.error) +
        (missing_interpreter ? " (is the interpreter named on its #! line installed?)" : ""));
  }
  return LaunchedProcess{pid, std::move(out.read), std::move(err.read)};
}

}  // namespace tandem::launcher
