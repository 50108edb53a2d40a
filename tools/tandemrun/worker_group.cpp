#include "tools/tandemrun/worker_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <tandem/base/errors.h>

#include "tools/tandemrun/worker_env.h"

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

// Seconds since `path` was last modified (its heartbeat); nullopt while it does not exist.
std::optional<double> seconds_since_modified(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) +
         static_cast<double>(now.tv_nsec - st.st_mtim.tv_nsec) * 1e-9;
}

// Opens (truncates) one worker log file; an empty path means none.
UniqueFd open_log_file(const std::string& path) {
  if (path.empty()) return UniqueFd();
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    throw Error("cannot create the worker log file " + path + ": " + std::strerror(errno) +
                "; choose a writable --log-dir");
  }
  return fd;
}

// A standby acknowledges its environment with one byte once it has set it. It may still be loading
// its libraries when a restart comes early, hence the generous limit; a program that never waits
// in tandem::run_main costs this much once, then the worker is started normally.
constexpr int kStandbyAckMs = 10'000;

bool acknowledged(int fd) {
  pollfd p{fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, kStandbyAckMs);
  } while (ready < 0 && errno == EINTR);
  char ack = 0;
  return ready == 1 && ::read(fd, &ack, 1) == 1 && ack == 'A';
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
  redirects_ = parse_std_spec(options_.redirects, "--redirects");
  tee_ = parse_std_spec(options_.tee, "--tee");
  // Like torchrun: error files live in the log dir whenever there is one; a temp one is made only
  // when some stream goes to a file.
  if (!options_.log_dir.empty() || redirects_.any() || tee_.any()) {
    log_dir_.emplace(options_.log_dir, options_.run_id);
    log_line("worker log files under " + log_dir_->path() +
             "/attempt_<restart>/<local rank>/");
  }
}

WorkerGroup::~WorkerGroup() {
  discard_standby();
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
  activated_ = 0;
  first_failure_ = -1;
  failures_seen_ = 0;
  if (log_dir_) log_dir_->prepare_attempt(restart_count, options_.nproc_per_node);
  try {
    for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank)
      spawn(local_rank, restart_count);
  } catch (...) {
    stop(SIGKILL, std::chrono::milliseconds(0));
    throw;
  }
  const size_t prepared = standby_.size();
  discard_standby();  // what was not used
  if (prepared > 0 && activated_ > 0) {
    log_line("restart " + std::to_string(restart_count) + ": " + std::to_string(activated_) +
             " of " + std::to_string(options_.nproc_per_node) +
             " workers taken over from standby processes (--standby)");
  }
  if (options_.standby && restart_count < options_.max_restarts) start_standby(restart_count);
}

void WorkerGroup::spawn(int local_rank, int restart_count) {
  const int rank = global_rank(options_, local_rank);
  WorkerSlot slot;
  slot.local_rank = local_rank;
  slot.restart_count = restart_count;
  const std::string file_stem =
      state_dir_ + "/restart" + std::to_string(restart_count) + "-rank" + std::to_string(rank);
  const std::string rank_dir =
      log_dir_ ? log_dir_->rank_dir(restart_count, local_rank) : std::string();
  slot.error_file = log_dir_ ? rank_dir + "/error.json" : file_stem + ".error.json";
  if (options_.heartbeat_timeout_s > 0) slot.heartbeat_file = file_stem + ".heartbeat";
  ::unlink(slot.error_file.c_str());
  if (!slot.heartbeat_file.empty()) ::unlink(slot.heartbeat_file.c_str());
  std::vector<std::string> env = build_worker_env(options_, slot, base_env_);
  const WorkerRoutes routes =
      route_worker(redirects_, tee_, options_.local_ranks_filter, local_rank, rank_dir);
  StreamSink out_sink{routes.out.console, open_log_file(routes.out.file)};
  StreamSink err_sink{routes.err.console, open_log_file(routes.err.file)};

  std::optional<Launched> process = activate_standby(local_rank, env);
  if (!process) process = launch(env, -1, "rank " + std::to_string(rank));
  Worker worker;
  worker.local_rank = local_rank;
  worker.rank = rank;
  worker.pid = process->pid;
  worker.error_file = slot.error_file;
  worker.heartbeat_file = slot.heartbeat_file;
  workers_.push_back(worker);
  output_.add_worker(local_rank, rank, std::move(process->out), std::move(process->err),
                     std::move(out_sink), std::move(err_sink));
}

WorkerGroup::Launched WorkerGroup::launch(std::vector<std::string>& env, int keep_fd,
                                          const std::string& who) {
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
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
               keep_fd, options_.program_path.c_str(), argv.data(), envp.data());
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw Error("cannot start " + who + ": fork() failed: " + std::strerror(fork_errno) +
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
        "cannot start " + who + " ('" + options_.program_path + "'): " + kStageNames[stage] +
        " failed: " + std::strerror(failure.error) +
        (missing_interpreter ? " (is the interpreter named on its #! line installed?)" : ""));
  }
  return Launched{pid, std::move(out.read), std::move(err.read)};
}

void WorkerGroup::start_standby(int restart_count) {
  discard_standby();
  // What a worker's libraries read while loading (OMP_NUM_THREADS) must be right already; the
  // per-rank variables come at activation. Without RANK a program that does not wait in
  // tandem::run_main fails at once instead of training as a duplicate.
  WorkerSlot slot;
  slot.restart_count = restart_count + 1;
  std::vector<std::string> predicted = build_worker_env(options_, slot, base_env_);
  std::vector<std::string> env = base_env_;
  for (const auto& e : predicted) {
    if (e.rfind("OMP_NUM_THREADS=", 0) == 0 &&
        std::none_of(env.begin(), env.end(),
                     [](const std::string& b) { return b.rfind("OMP_NUM_THREADS=", 0) == 0; }))
      env.push_back(e);
  }
  try {
    for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank) {
      // A socket pair, not a pipe: the standby acknowledges its environment on the same channel.
      int fds[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
        throw Error(std::string("socketpair() failed: ") + std::strerror(errno));
      UniqueFd ours(fds[0]);
      UniqueFd theirs(fds[1]);
      std::vector<std::string> standby_env = env;
      standby_env.push_back("TANDEM_STANDBY_FD=" + std::to_string(theirs.get()));
      Launched process = launch(standby_env, theirs.get(),
                                "the standby of local rank " + std::to_string(local_rank));
      standby_.push_back(Standby{std::move(process), std::move(ours)});
    }
  } catch (const Error& e) {
    log_line(std::string("--standby: ") + e.what() + "; restarts will start workers normally");
    discard_standby();
  }
}

std::optional<WorkerGroup::Launched> WorkerGroup::activate_standby(int local_rank,
                                                                   std::vector<std::string>& env) {
  if (static_cast<size_t>(local_rank) >= standby_.size()) return std::nullopt;
  Standby& standby = standby_[static_cast<size_t>(local_rank)];
  if (standby.process.pid <= 0) return std::nullopt;
  std::string message;
  for (const auto& e : env) message.append(e).push_back('\0');
  message.push_back('\0');
  const bool alive = ::waitpid(standby.process.pid, nullptr, WNOHANG) == 0;
  if (alive && write_all(standby.control.get(), message.data(), message.size()) &&
      acknowledged(standby.control.get())) {
    standby.control.reset();
    ++activated_;
    Launched process = std::move(standby.process);
    standby.process.pid = -1;
    return process;
  }
  log_line("the standby of local rank " + std::to_string(local_rank) +
           (alive ? " did not take its environment" : " exited before it was needed") +
           " (does the program call tandem::run_main?); starting the worker normally");
  ::killpg(standby.process.pid, SIGKILL);
  ::waitpid(standby.process.pid, nullptr, 0);
  standby.process.pid = -1;
  return std::nullopt;
}

void WorkerGroup::discard_standby() {
  for (auto& standby : standby_) {
    if (standby.process.pid <= 0) continue;
    ::killpg(standby.process.pid, SIGKILL);
    ::waitpid(standby.process.pid, nullptr, 0);
  }
  standby_.clear();
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
    std::optional<Clock::time_point> wake;
    if (options_.heartbeat_timeout_s > 0) {
      check_heartbeats();
      if (first_failure_ >= 0) continue;
      wake = Clock::now() +
             std::chrono::microseconds(std::llround(options_.monitor_interval_s * 1e6));
    }
    if (hook_) {
      if (hook_()) {
        MonitorResult result;
        result.outcome = MonitorResult::Outcome::kExternal;
        return result;
      }
      const auto next = Clock::now() + hook_interval_;
      if (!wake || next < *wake) wake = next;
    }
    pump_once(wake);
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
