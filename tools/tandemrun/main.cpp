// tandemrun: the torchrun-style local launcher. See docs/launcher.md.
//
// Exit status: 0 all workers exited 0 (possibly after restarts); 1 a worker failed and no
// restart was left (or the launch itself failed); 2 bad command line (nothing started), or a
// worker failed in a way no restart can fix (root_cause.h); 128+N stopped by signal N.
//
// Single-node runs stay a plain POSIX program: no store, no threads. Multi-node runs
// (elastic_agent.cpp) and --ft runs (ft_reporter.h) load libtorch's c10d TCPStore (agent_store.h),
// which runs threads; workers are still forked from the main thread and the child makes only
// async-signal-safe calls until execve.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include <tandem/base/errors.h>

#include "base/launch_contract.h"
#include "tools/tandemrun/elastic/elastic_agent.h"
#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/launch/free_port.h"
#include "tools/tandemrun/ft/ft_reporter.h"
#include "tools/tandemrun/launch/launcher_options.h"
#include "tools/tandemrun/report/launcher_trace.h"
#include "tools/tandemrun/supervise/root_cause.h"
#include "tools/tandemrun/report/run_summary.h"
#include "tools/tandemrun/launch/signal_relay.h"
#include "tools/tandemrun/launch/worker_env.h"
#include "tools/tandemrun/launch/worker_group.h"

namespace tandem::launcher {
namespace {

// The launch contract's exit codes (base/launch_contract.h): a failure a restart cannot fix
// (root_cause.h's final_reason) has the status of a bad command line and of run_main's
// configuration error, so scripts tell "fix something" from "it crashed".
constexpr int kExitWorkerFailed = launch::kExitFailed;
constexpr int kExitUsage = launch::kExitFinal;
constexpr int kExitFinal = launch::kExitFinal;

// How long the other workers may take to fail by themselves after a failure that looks like the
// consequence of another one (bounded by --grace-period-s as well).
constexpr std::chrono::milliseconds kSettleLimit{3000};
// How long the workers still running get to dump their flight recorders after a failure.
constexpr std::chrono::milliseconds kFlightDumpLimit{3000};

int run_workers(LauncherOptions options, std::vector<std::string> env) {
  const auto grace = std::chrono::milliseconds(std::llround(options.grace_period_s * 1000.0));
  SignalRelay signals;
  WorkerGroup group(options, std::move(env), signals);
  std::vector<FailureRecord> failures;  // the first failure of every attempt, in order
  // --ft: tandemrun serves the store for the whole run (one port) and reports dead workers.
  std::unique_ptr<FtReporter> ft;
  if (options.ft)
    ft = std::make_unique<FtReporter>(options, options.master_addr, options.master_port, true);
  FtTally tally;  // tolerated failures and replacements, over all attempts
  for (int restart_count = 0;; ++restart_count) {
    if (restart_count > 0 && options.standalone && !ft) {
      // A fresh port per attempt: the old rank 0's store socket may linger (TIME_WAIT).
      group.set_master_port(pick_free_port(options.master_addr));
    }
    if (ft) ft->new_attempt();
    group.start(restart_count);
    MonitorResult result = group.monitor();
    // --ft: report each failed worker to the others and let them go on, while any still runs.
    if (ft) result = ft->monitor(group, restart_count, result, tally);
    switch (result.outcome) {
      case MonitorResult::Outcome::kSucceeded:
        group.stop(SIGTERM, grace);  // all exited: only ends what they may have left running
        if (restart_count > 0) {
          log_line("all workers exited 0 after " + std::to_string(restart_count) + " restart" +
                   (restart_count == 1 ? "" : "s"));
        }
        if (tally.tolerated > 0) {
          log_line("the remaining workers exited 0; " + std::to_string(tally.tolerated) + " worker" +
                   (tally.tolerated == 1 ? "" : "s") + " failed and the others went on without " +
                   (tally.tolerated == 1 ? "it" : "them") + " (--ft)");
        }
        return 0;
      case MonitorResult::Outcome::kWorkerFailed: {
        const Worker& first_seen =
            group.workers()[static_cast<std::size_t>(result.failed_local_rank)];
        if (group.workers().size() > 1) {
          log_line("rank " + std::to_string(first_seen.rank) + " " +
                   describe_failure(first_seen, options.heartbeat_timeout_s) +
                   "; stopping the other workers (SIGTERM, SIGKILL after " +
                   seconds_text(options.grace_period_s) + ")");
          // A worker that failed because a peer failed first (its communicator saw the peer go)
          // may exit before that peer has finished failing: give the others a moment to fail by
          // themselves and write their error files, so the root cause is the peer.
          const auto error = launch::read_error_file(first_seen.error_file);
          if (error && looks_secondary(*error)) {
            // Until some worker failed for a reason of its own.
            group.settle(std::min(grace, kSettleLimit), [&group] {
              for (const auto& w : group.workers()) {
                if (!w.failed_on_its_own()) continue;
                const auto e = launch::read_error_file(w.error_file);
                if (!e || !looks_secondary(*e)) return true;
              }
              return false;
            });
          }
        }
        group.request_flight_dumps(restart_count, kFlightDumpLimit);
        group.stop(SIGTERM, grace);
        const int root = root_cause_local_rank(group.workers(), result.failed_local_rank);
        const Worker& failed = group.workers()[static_cast<std::size_t>(root)];
        failures.push_back(record_failure(failed, restart_count, options.heartbeat_timeout_s));
        const int stop_signal = group.received_stop_signal();
        const FailureRecord& f = failures.back();
        const bool cannot_fix = !f.final_reason.empty();
        if (cannot_fix && stop_signal == 0) {
          log_line("rank " + std::to_string(f.rank) + " " + f.what + " (" + f.final_reason + ")" +
                   (f.error ? ": " + f.error->message : std::string()) +
                   "; a restart cannot fix it; not restarting");
        }
        if (restart_count + tally.replaced < options.max_restarts && stop_signal == 0 && !cannot_fix) {
          log_line("rank " + std::to_string(f.rank) + " " + f.what +
                   (f.error ? ": " + f.error->message : std::string()) +
                   "; restarting all workers (restart " + std::to_string(restart_count + 1) +
                   " of at most " + std::to_string(options.max_restarts) + ")");
          continue;
        }
        print_failure_summary(group.workers(), root, options.grace_period_s);
        print_root_cause(failures, options.max_restarts);
        if (stop_signal != 0) {
          log_line("received " + signal_name(stop_signal) + " while handling the failure; not " +
                   "restarting");
          return 128 + stop_signal;
        }
        return cannot_fix ? kExitFinal : kExitWorkerFailed;
      }
      case MonitorResult::Outcome::kInterrupted:
        return stop_on_signal(group, result.signal, options.grace_period_s);
      case MonitorResult::Outcome::kExternal:
        break;  // only with a monitor hook (the multi-node agent); none is set here
    }
    return kExitWorkerFailed;
  }
}

int tandemrun_main(int argc, char** argv) {
  ensure_standard_fds();
  CommandLine command_line;
  try {
    command_line = parse_command_line(argc, argv);
    if (command_line.action == CommandLine::Action::kPrintAndExit) {
      write_all(1, command_line.text);
      return 0;
    }
    resolve_launch_values(command_line.options);
  } catch (const ConfigError& e) {
    log_line(std::string("error: ") + e.what());
    log_line("run 'tandemrun --help' for usage");
    return kExitUsage;
  }

  const LauncherOptions& options = command_line.options;
  if (!options.launch_sources.empty()) log_line(options.launch_sources);
  std::vector<std::string> env = current_environment();
  if (omp_threads_defaulted(options, env)) {
    log_line("OMP_NUM_THREADS is not set; setting it to 1 for each of the " +
             std::to_string(options.nproc_per_node) +
             " workers to avoid overloading the machine (set it yourself to tune)");
  }
  // Multi-node: the elastic agent (the only path that creates a rendezvous store).
  if (options.multi_node()) return run_elastic_agent(options, std::move(env));
  try {
    const bool traced = !options.trace_dir.empty() && trace::prepare_trace_dir(options.trace_dir, env);
    const int status = run_workers(options, std::move(env));
    if (traced) trace::report_trace_dir(options.trace_dir);  // docs/timeline.md
    return status;
  } catch (const Error& e) {
    log_line(std::string("error: ") + e.what());
    return kExitWorkerFailed;
  }
}

}  // namespace
}  // namespace tandem::launcher

int main(int argc, char** argv) { return tandem::launcher::tandemrun_main(argc, argv); }
