// tandemrun: the torchrun-style local launcher. See docs/launcher.md.
//
// Exit status: 0 all workers exited 0; 1 a worker failed (or the launch itself failed);
// 2 bad command line, nothing started; 128+N stopped by signal N.
//
// A plain POSIX program on purpose: it links neither libtorch nor the tandem library, so it
// starts no threads of its own and fork() + exec is safe.

#include <signal.h>

#include <chrono>
#include <cmath>
#include <sstream>

#include "fd_io.h"
#include "launcher_options.h"
#include "run_summary.h"
#include "signal_relay.h"
#include "tandem/errors.h"
#include "worker_env.h"
#include "worker_group.h"

namespace tandem::launcher {
namespace {

constexpr int kExitWorkerFailed = 1;
constexpr int kExitUsage = 2;

std::string seconds(double s) {
  std::ostringstream text;
  text << s << " s";
  return text.str();
}

int run_workers(const LauncherOptions& options, std::vector<std::string> env) {
  const auto grace = std::chrono::milliseconds(std::llround(options.grace_period_s * 1000.0));
  SignalRelay signals;
  WorkerGroup group(options, std::move(env), signals);
  group.start(/*restart_count=*/0);
  const MonitorResult result = group.monitor();
  switch (result.outcome) {
    case MonitorResult::Outcome::kSucceeded:
      group.stop(SIGTERM, grace);  // all exited: only ends what they may have left running
      return 0;
    case MonitorResult::Outcome::kWorkerFailed: {
      const Worker& failed = group.workers()[static_cast<std::size_t>(result.failed_local_rank)];
      if (group.workers().size() > 1) {
        log_line("rank " + std::to_string(failed.rank) + " " + describe(*failed.exit) +
                 "; stopping the other workers (SIGTERM, SIGKILL after " +
                 seconds(options.grace_period_s) + ")");
      }
      group.stop(SIGTERM, grace);
      print_failure_summary(group.workers(), result.failed_local_rank, options.grace_period_s);
      return kExitWorkerFailed;
    }
    case MonitorResult::Outcome::kInterrupted:
      log_line("received " + signal_name(result.signal) +
               "; forwarding it to the workers (SIGKILL after " + seconds(options.grace_period_s) +
               ")");
      group.stop(result.signal, grace);
      print_interrupt_summary(group.workers(), result.signal, options.grace_period_s);
      return 128 + result.signal;
  }
  return kExitWorkerFailed;
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
  std::vector<std::string> env = current_environment();
  if (omp_threads_defaulted(options, env)) {
    log_line("OMP_NUM_THREADS is not set; setting it to 1 for each of the " +
             std::to_string(options.nproc_per_node) +
             " workers to avoid overloading the machine (set it yourself to tune)");
  }
  try {
    return run_workers(options, std::move(env));
  } catch (const Error& e) {
    log_line(std::string("error: ") + e.what());
    return kExitWorkerFailed;
  }
}

}  // namespace
}  // namespace tandem::launcher

int main(int argc, char** argv) { return tandem::launcher::tandemrun_main(argc, argv); }
