#include "worker_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "tandem/errors.h"
#include "worker_env.h"

namespace tandem::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Upper bound on one poll(): wake-ups are event driven (SIGCHLD, output); this is a safety net.
constexpr int kMaxPollMs = 1000;
// How long to wait for SIGKILLed workers to disappear before giving up on them (a process stuck
// in uninterruptible sleep can outlive SIGKILL for a while).
constexpr std::chrono::seconds kKillWait{10};

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
                             int status_fd, const char* path, char* const* argv,
                             char* const* envp) {
  SignalRelay::reset_in_child();
  if (::setpgid(0, 0) != 0) child_fail(status_fd, kSetpgid, errno);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(status_fd, kDeathSignal, errno);
  // If the launcher died before prctl() took effect, the death signal will never come.
  if (::getppid() != parent) child_fail(status_fd, kParentCheck, ESRCH);
  if (::dup2(stdin_fd, 0) < 0 || ::dup2(stdout_fd, 1) < 0 || ::dup2(stderr_fd, 2) < 0) {
    child_fail(status_fd, kDup2, errno);
  }
  ::execve(path, argv, envp);
  child_fail(status_fd, kExec, errno);
}

// Seconds since `path` was last modified (its heartbeat); nullopt while it does not exist.
std::optional<double> seconds_since_modified(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) +
         static_cast<double>(now.tv_nsec - st.st_mtim.tv_nsec) * 1e-9;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

WorkerGroup::WorkerGroup(LauncherOptions options, std::vector<std::string> base_env,
                         SignalRelay& signals)
    : options_(std::move(options)), base_env_(std::move(base_env)), signals_(signals) {
  // Workers read no terminal input: they run in background process groups, where reading the
  // terminal would stop them (SIGTTIN).
  dev_null_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null_.valid())
    throw Error(std::string("cannot open /dev/null: ") + std::strerror(errno));
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandemrun-XXXXXX";
  if (::mkdtemp(dir_template.data()) == nullptr) {
    throw Error("cannot create a directory for the workers' error files (" + dir_template +
                "): " + std::strerror(errno) + "; set TMPDIR to a writable directory");
  }
  state_dir_ = dir_template;
}

WorkerGroup::~WorkerGroup() {
  if (!state_dir_.empty()) {
    if (DIR* dir = ::opendir(state_dir_.c_str())) {
      while (const dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") ::unlink((state_dir_ + "/" + name).c_str());
      }
      ::closedir(dir);
    }
    ::rmdir(state_dir_.c_str());
  }
  if (!any_running() &&
      std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.reaped; })) {
    return;
  }
  signal_all(SIGKILL);
  // Bounded: a process in uninterruptible sleep may outlive SIGKILL for a while.
  const auto give_up = Clock::now() + kKillWait;
  for (auto& w : workers_) {
    while (!w.reaped && w.pid > 0) {
      const pid_t r = ::waitpid(w.pid, nullptr, WNOHANG);
      if (r == w.pid || (r < 0 && errno != EINTR) || Clock::now() >= give_up) break;
      ::usleep(10'000);
    }
    w.reaped = true;
  }
}

void WorkerGroup::start(int restart_count) {
  if (any_running())
    throw Error("internal: WorkerGroup::start() while workers of the last start still run");
  reap_all();
  workers_.clear();
  first_failure_ = -1;
  failures_seen_ = 0;
  try {
    for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank)
      spawn(local_rank, restart_count);
  } catch (...) {
    stop(SIGKILL, std::chrono::milliseconds(0));
    throw;
  }
}

void WorkerGroup::spawn(int local_rank, int restart_count) {
  const int rank = global_rank(options_, local_rank);
  WorkerSlot slot;
  slot.local_rank = local_rank;
  slot.restart_count = restart_count;
  const std::string file_stem =
      state_dir_ + "/restart" + std::to_string(restart_count) + "-rank" + std::to_string(rank);
  slot.error_file = file_stem + ".error.json";
  if (options_.heartbeat_timeout_s > 0) slot.heartbeat_file = file_stem + ".heartbeat";
  ::unlink(slot.error_file.c_str());
  if (!slot.heartbeat_file.empty()) ::unlink(slot.heartbeat_file.c_str());
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> env = build_worker_env(options_, slot, base_env_);
  std::vector<std::string> args{options_.program};
  args.insert(args.end(), options_.program_args.begin(), options_.program_args.end());
  std::vector<char*> argv = c_strings(args);
  std::vector<char*> envp = c_strings(env);
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
    exec_child(parent, dev_null_.get(), out.write.get(), err.write.get(), status.write.get(),
               options_.program_path.c_str(), argv.data(), envp.data());
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw Error("cannot start rank " + std::to_string(rank) + ": fork() failed: " +
                std::strerror(fork_errno) + "; too many processes? check `ulimit -u`");
  }
  ::setpgid(pid, pid);  // the child does the same; doing it here too closes the race with killpg()

  Worker worker;
  worker.local_rank = local_rank;
  worker.rank = rank;
  worker.pid = pid;
  worker.error_file = slot.error_file;
  worker.heartbeat_file = slot.heartbeat_file;
  workers_.push_back(worker);
  out.write.reset();
  err.write.reset();
  status.write.reset();
  output_.add_worker(local_rank, rank, std::move(out.read), std::move(err.read));

  // End-of-file on the status pipe means execve() succeeded (the pipe is close-on-exec).
  ChildFailure failure{};
  ssize_t n;
  do {
    n = ::read(status.read.get(), &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(failure))) {
    const int stage = std::clamp(failure.stage, 0, kStageCount - 1);
    const bool missing_interpreter = stage == kExec && failure.error == ENOENT;
    throw Error(
        "cannot start rank " + std::to_string(rank) + " ('" + options_.program_path +
        "'): " + kStageNames[stage] + " failed: " + std::strerror(failure.error) +
        (missing_interpreter ? " (is the interpreter named on its #! line installed?)" : ""));
  }
}

MonitorResult WorkerGroup::monitor() {
  for (;;) {
    if (first_failure_ >= 0) {
      MonitorResult result;
      result.outcome = MonitorResult::Outcome::kWorkerFailed;
      result.failed_local_rank = first_failure_;
      return result;
    }
    if (!pending_stop_signals_.empty()) {
      MonitorResult result;
      result.outcome = MonitorResult::Outcome::kInterrupted;
      result.signal = pending_stop_signals_.front();
      pending_stop_signals_.clear();
      return result;
    }
    if (!any_running()) return MonitorResult{};
    if (options_.heartbeat_timeout_s > 0) {
      check_heartbeats();
      if (first_failure_ >= 0) continue;
      pump_once(Clock::now() +
                std::chrono::microseconds(std::llround(options_.monitor_interval_s * 1e6)));
    } else {
      pump_once(std::nullopt);
    }
  }
}

void WorkerGroup::check_heartbeats() {
  for (auto& w : workers_) {
    if (w.exit || w.reaped || w.heartbeat_file.empty()) continue;
    const std::optional<double> silent = seconds_since_modified(w.heartbeat_file);
    if (!silent || *silent <= options_.heartbeat_timeout_s) continue;  // no beat yet, or alive
    w.hung = true;
    w.silent_s = *silent;
    w.failure_order = failures_seen_++;
    if (first_failure_ < 0) first_failure_ = w.local_rank;
  }
}

void WorkerGroup::stop(int first_signal, std::chrono::milliseconds grace) {
  signal_all(first_signal);
  if (first_signal != SIGKILL && first_signal != SIGCONT) {
    // A stopped worker (SIGSTOP, a debugger detached) would only act on the signal once continued.
    for (const auto& w : workers_) {
      if (!w.reaped && w.pid > 0 && !w.exit) ::killpg(w.pid, SIGCONT);
    }
  }
  const auto grace_end = Clock::now() + grace;
  bool cut_short = false;
  while (any_running() && Clock::now() < grace_end) {
    // Anything pending here arrived after monitor() returned: the user insists, so skip the grace.
    if (!pending_stop_signals_.empty()) {
      log_line("received " + signal_name(pending_stop_signals_.front()) +
               " while stopping the workers; killing them now");
      pending_stop_signals_.clear();
      cut_short = true;
      break;
    }
    pump_once(grace_end);
  }
  for (auto& w : workers_) {
    if (w.exit) continue;
    w.escalated = true;
    w.grace_cut_short = cut_short;
  }
  signal_all(SIGKILL);
  const auto kill_end = Clock::now() + kKillWait;
  while (any_running() && Clock::now() < kill_end) pump_once(kill_end);
  for (const auto& w : workers_) {
    if (!w.exit) {
      log_line("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
               ") is still there " + std::to_string(kKillWait.count()) +
               " s after SIGKILL (uninterruptible sleep?); giving up on it");
    }
  }
  output_.drain_all();
  reap_all();
}

void WorkerGroup::settle(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  const auto end = Clock::now() + limit;
  while (any_running() && Clock::now() < end && pending_stop_signals_.empty() && !done())
    pump_once(end);
}

void WorkerGroup::pump_once(std::optional<Clock::time_point> deadline) {
  std::vector<pollfd> fds;
  fds.push_back(pollfd{signals_.fd(), POLLIN, 0});
  output_.append_poll_fds(fds);
  int timeout_ms = kMaxPollMs;
  if (deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count() + 1;
    timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, kMaxPollMs));
  }
  const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
  if (ready < 0 && errno != EINTR)
    throw Error(std::string("poll() failed: ") + std::strerror(errno));
  if (ready > 0) {
    if (fds[0].revents != 0) {
      ReceivedSignals received = signals_.drain();
      if (received_stop_signal_ == 0 && !received.stop_signals.empty())
        received_stop_signal_ = received.stop_signals.front();
      pending_stop_signals_.insert(pending_stop_signals_.end(), received.stop_signals.begin(),
                                   received.stop_signals.end());
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) output_.on_ready(fds[i].fd);
    }
  }
  refresh_exits();  // every pass, not only on SIGCHLD: cheap, and immune to a lost wake-up byte
}

void WorkerGroup::refresh_exits() {
  for (auto& w : workers_) {
    if (w.exit || w.reaped || w.pid <= 0) continue;
    siginfo_t info{};
    // WNOWAIT: learn the status but keep the zombie, so its pid (= its process group id) stays
    // reserved until stop() has signalled the group.
    if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
      continue;
    if (info.si_pid != w.pid) continue;  // still running
    WorkerExit exit;
    exit.signaled = info.si_code != CLD_EXITED;
    exit.code = info.si_status;
    w.exit = exit;
    // All it wrote is in the pipe by now: print it before any summary.
    output_.drain_worker(w.local_rank);
    if (!exit.success() && w.failure_order < 0) w.failure_order = failures_seen_++;
    if (!exit.success() && first_failure_ < 0) first_failure_ = w.local_rank;
  }
}

void WorkerGroup::signal_all(int signo) {
  for (auto& w : workers_) {
    if (w.reaped || w.pid <= 0) continue;
    if (!w.exit && w.stop_signal == 0) w.stop_signal = signo;
    ::killpg(w.pid, signo);  // ESRCH when the group is empty: fine
    // A worker that moved itself to another group (setsid) is signalled directly.
    if (!w.exit && ::getpgid(w.pid) != w.pid) ::kill(w.pid, signo);
  }
}

bool WorkerGroup::any_running() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const Worker& w) { return !w.exit && !w.reaped; });
}

void WorkerGroup::reap_all() {
  for (auto& w : workers_) {
    if (w.reaped || !w.exit) continue;
    pid_t r;
    do {
      r = ::waitpid(w.pid, nullptr, 0);  // a zombie already: returns at once
    } while (r < 0 && errno == EINTR);
    w.reaped = true;
  }
}

}  // namespace tandem::launcher
