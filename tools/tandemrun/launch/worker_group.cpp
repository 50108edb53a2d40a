#include "tools/tandemrun/launch/worker_group.h"

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
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <tandem/base/errors.h>

#include "tools/tandemrun/report/flight_dumps.h"
#include "tools/tandemrun/launch/worker_env.h"

namespace tandem::launcher {
namespace {

// Removes one of tandemrun's own directories and what is in it; "" does nothing.
void remove_directory(const std::string& dir) {
  std::error_code ignored;
  if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
}

using Clock = std::chrono::steady_clock;

// Upper bound on one poll(): wake-ups are event driven (SIGCHLD, output); this is a safety net.
constexpr int kMaxPollMs = 1000;
// How long to wait for SIGKILLed workers to disappear before giving up on them (a process stuck
// in uninterruptible sleep can outlive SIGKILL for a while).
constexpr std::chrono::seconds kKillWait{10};

// Opens (truncates) one worker log file; an empty path means none. `append`: a replacement's
// lines follow those of the worker it replaces.
UniqueFd open_log_file(const std::string& path, bool append) {
  if (path.empty()) return UniqueFd();
  const int mode = append ? O_APPEND : O_TRUNC;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | mode | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    throw Error("cannot create the worker log file " + path + ": " + std::strerror(errno) +
                "; choose a writable --log-dir");
  }
  return fd;
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
  if (options_.metrics_port > 0) {
    std::string metrics = (::access("/dev/shm", W_OK) == 0 ? std::string("/dev/shm") : state_dir_) +
                          "/tandemrun-metrics-XXXXXX";
    if (::mkdtemp(metrics.data()) == nullptr) {
      throw Error("cannot create a directory for the workers' live metrics (" + metrics +
                  "): " + std::strerror(errno));
    }
    metrics_dir_ = metrics;
    metrics_ = std::make_unique<MetricsServer>(options_.metrics_host, options_.metrics_port);
    log_line("metrics of the local ranks at http://" + options_.metrics_host + ":" +
             std::to_string(options_.metrics_port) + "/metrics (Prometheus text format)");
  }
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
  metrics_.reset();
  remove_directory(metrics_dir_);
  standby_.discard();
  remove_directory(state_dir_);
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
      workers_.push_back(spawn(local_rank, restart_count));
  } catch (...) {
    stop(SIGKILL, std::chrono::milliseconds(0));
    throw;
  }
  if (metrics_) {
    std::vector<MetricsServer::Source> sources;
    for (const auto& w : workers_) {
      const std::string file = metrics_dir_ + "/rank" + std::to_string(w.rank) + ".txt";
      ::unlink(file.c_str());  // the last attempt's numbers are not this one's
      sources.push_back({w.rank, file});
    }
    metrics_->set_sources(std::move(sources));
    metrics_->set_restarts(restart_count);
  }
  const size_t prepared = standby_.size();
  standby_.discard();  // what was not used
  if (prepared > 0 && activated_ > 0) {
    const char* why = options_.standby_mode == StandbyMode::kOn
                          ? "--standby"
                          : "the default; --no-standby turns it off";
    log_line("restart " + std::to_string(restart_count) + ": " + std::to_string(activated_) +
             " of " + std::to_string(options_.nproc_per_node) +
             " workers taken over from standby processes (" + why + ")");
  }
  if (options_.standby && restart_count < options_.max_restarts) start_standby(restart_count);
}

Worker WorkerGroup::spawn(int local_rank, int restart_count, int incarnation) {
  const int rank = global_rank(options_, local_rank);
  WorkerSlot slot;
  slot.local_rank = local_rank;
  slot.restart_count = restart_count;
  slot.incarnation = incarnation;
  const std::string suffix = incarnation > 0 ? "." + std::to_string(incarnation) : "";
  const std::string file_stem = state_dir_ + "/restart" + std::to_string(restart_count) + "-rank" +
                                std::to_string(rank) + suffix;
  const std::string rank_dir =
      log_dir_ ? log_dir_->rank_dir(restart_count, local_rank) : std::string();
  slot.error_file = log_dir_ ? rank_dir + "/error" + suffix + ".json" : file_stem + ".error.json";
  if (options_.heartbeat_timeout_s > 0) slot.heartbeat_file = file_stem + ".heartbeat";
  slot.flight_dir = flight_dir(restart_count);
  if (metrics_) slot.metrics_file = metrics_dir_ + "/rank" + std::to_string(rank) + ".txt";
  ::unlink(slot.error_file.c_str());
  if (!slot.heartbeat_file.empty()) ::unlink(slot.heartbeat_file.c_str());
  std::vector<std::string> env = build_worker_env(options_, slot, base_env_);
  const WorkerRoutes routes =
      route_worker(redirects_, tee_, options_.local_ranks_filter, local_rank, rank_dir);
  StreamSink out_sink{routes.out.console, open_log_file(routes.out.file, incarnation > 0)};
  StreamSink err_sink{routes.err.console, open_log_file(routes.err.file, incarnation > 0)};

  std::optional<LaunchedProcess> process = standby_.activate(local_rank, env);
  if (process) {
    ++activated_;
  } else {
    process = launch_process(program_spec(std::move(env), "rank " + std::to_string(rank)));
  }
  Worker worker;
  worker.local_rank = local_rank;
  worker.rank = rank;
  worker.pid = process->pid;
  worker.error_file = slot.error_file;
  worker.heartbeat_file = slot.heartbeat_file;
  worker.incarnation = incarnation;
  output_.add_worker(local_rank, rank, std::move(process->out), std::move(process->err),
                     std::move(out_sink), std::move(err_sink));
  return worker;
}

bool WorkerGroup::replace_worker(int local_rank, int restart_count, bool restock) {
  Worker& old = workers_.at(static_cast<std::size_t>(local_rank));
  if (!old.exit) {  // a hung one: SIGKILLed by the reporter, or now
    kill_worker(local_rank);
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(old.pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
    old.exit = WorkerExit{info.si_code != CLD_EXITED, info.si_status};
  }
  output_.drain_worker(local_rank);  // its last lines, before the new one's pipes are added
  // Whatever it left running goes with it; the zombie is reaped only after that, so its process
  // group id cannot be reused in between.
  if (!old.reaped && old.pid > 0) {
    ::killpg(old.pid, SIGKILL);
    while (::waitpid(old.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  const int incarnation = old.incarnation + 1;
  const int activated = activated_;
  workers_[static_cast<std::size_t>(local_rank)] = spawn(local_rank, restart_count, incarnation);
  const bool from_standby = activated_ > activated;
  if (from_standby && restock &&
      (options_.standby_mode != StandbyMode::kAuto || !standby_memory_shortage(1)))
    standby_.restock(local_rank);
  return from_standby;
}

LaunchSpec WorkerGroup::program_spec(std::vector<std::string> env, std::string who) const {
  LaunchSpec spec;
  spec.path = options_.program_path;
  spec.argv.push_back(options_.program);
  spec.argv.insert(spec.argv.end(), options_.program_args.begin(), options_.program_args.end());
  spec.env = std::move(env);
  spec.stdin_fd = dev_null_.get();
  spec.who = std::move(who);
  return spec;
}

void WorkerGroup::start_standby(int restart_count) {
  if (options_.standby_mode == StandbyMode::kAuto) {
    if (const auto shortage = standby_memory_shortage(options_.nproc_per_node)) {
      if (!memory_warned_) {
        log_line("not keeping standby workers for restarts: " + *shortage +
                 " (--standby keeps them anyway)");
      }
      memory_warned_ = true;
      return;
    }
  }
  // What a worker's libraries read while loading (OMP_NUM_THREADS) must be right already; the
  // per-rank variables come at activation. A program that does not wait in tandem::run_main
  // would run without them: by default only programs that call it get standbys.
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
  standby_.start(options_.nproc_per_node, program_spec(std::move(env), "a standby"));
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
  struct Silent {
    Worker* worker;
    double seconds;
    bool stopped;
  };
  std::vector<Silent> silent;
  bool over_timeout = false;
  for (auto& w : workers_) {
    if (w.exit || w.reaped || w.hung || w.heartbeat_file.empty()) continue;
    std::optional<double> s = seconds_since_modified(w.heartbeat_file);
    if (!s) continue;  // no beat yet: still starting
    if (cleared_at_) s = std::min(*s, std::chrono::duration<double>(Clock::now() - *cleared_at_).count());
    const bool stopped = is_stopped(w.pid);
    if (*s > options_.heartbeat_timeout_s) over_timeout = true;
    if (*s > options_.heartbeat_timeout_s || stopped) silent.push_back({&w, *s, stopped});
  }
  if (!over_timeout) return;
  // When one rank hangs, its peers wait for it in the next collective and go silent too, within
  // moments (heartbeats are coarse: one touch per 100 ms). The ones that went silent by
  // themselves come first: those stopped by a signal (they can never beat again), then the
  // longest silent.
  std::stable_sort(silent.begin(), silent.end(), [](const Silent& a, const Silent& b) {
    return a.stopped != b.stopped ? a.stopped : a.seconds > b.seconds;
  });
  // --ft: only the first is failed; the others go on once it is gone (their silence then counts
  // afresh, clear_failures()).
  if (options_.ft) silent.resize(1);
  for (const Silent& s : silent) {
    s.worker->hung = true;
    s.worker->silent_s = s.seconds;
    s.worker->failure_order = failures_seen_++;
    if (first_failure_ < 0) first_failure_ = s.worker->local_rank;
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

std::string WorkerGroup::flight_dir(int restart_count) const {
  return launcher::flight_dir(log_dir_ ? log_dir_->path() : "", options_.run_id, restart_count);
}

void WorkerGroup::request_flight_dumps(int restart_count, std::chrono::milliseconds limit) {
  const std::string dir = flight_dir(restart_count);
  const std::time_t asked = std::time(nullptr);
  std::vector<std::string> files;
  for (const auto& w : workers_) {
    if (w.exit || w.reaped || w.pid <= 0) continue;
    // A stopped worker stays stopped: continued, it would also go on training (its peers with
    // it) past the point it was found hung, and the restart's checkpoint would depend on how far
    // it got before SIGTERM. Its ring is read here instead, without its help.
    if (is_stopped(w.pid)) {
      const std::string done = dump_stopped_worker(w.pid, w.rank, dir);
      if (!done.empty()) log_line("flight recorder: " + done);
      continue;
    }
    if (!catches_sigusr1(w.pid)) continue;
    if (::kill(w.pid, SIGUSR1) == 0) files.push_back(dir + "/flight_rank" + std::to_string(w.rank) + ".json");
  }
  const auto fresh = [&] {
    for (const auto& f : files) {
      struct stat st;
      if (::stat(f.c_str(), &st) != 0 || st.st_mtime < asked) return false;
    }
    return true;
  };
  settle(limit, fresh);
  const int dumps = count_flight_dumps(dir);
  if (dumps > 0) {
    log_line("flight recorder: " + std::to_string(dumps) + " rank(s) dumped their recent collectives to " +
             dir + "; `tandem-trace flight " + dir + "` says which rank is behind and where the ranks disagree");
  }
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

void WorkerGroup::kill_worker(int local_rank) {
  Worker& w = workers_.at(static_cast<std::size_t>(local_rank));
  if (w.reaped || w.pid <= 0 || w.exit) return;
  ::killpg(w.pid, SIGKILL);
  if (::getpgid(w.pid) != w.pid) ::kill(w.pid, SIGKILL);
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
