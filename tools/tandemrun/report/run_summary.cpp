#include "tools/tandemrun/report/run_summary.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <sstream>

#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/supervise/root_cause.h"

namespace tandem::launcher {

std::string describe_worker(const Worker& w, double grace_period_s) {
  std::ostringstream line;
  line << "rank " << w.rank << " (pid " << w.pid << ") ";
  if (w.hung) {
    line << "sent no heartbeat for " << static_cast<int>(w.silent_s)
         << " s (hung; over the --heartbeat-timeout) and ";
  }
  if (!w.exit) {
    line << "did not exit even after SIGKILL";
    return line.str();
  }
  line << describe(*w.exit);
  if (w.stop_signal == 0) return line.str();
  if (w.escalated && w.stop_signal != SIGKILL && w.grace_cut_short) {
    line << " after tandemrun sent " << signal_name(w.stop_signal)
         << ", then SIGKILL when a second signal cut the grace period short";
  } else if (w.escalated && w.stop_signal != SIGKILL) {
    line << " after ignoring " << signal_name(w.stop_signal) << " for the " << grace_period_s
         << " s grace period";
  } else {
    line << " after tandemrun sent " << signal_name(w.stop_signal);
  }
  return line.str();
}

void print_failure_summary(const std::vector<Worker>& workers, int failed_local_rank,
                           double grace_period_s) {
  std::ostringstream out;
  for (const auto& w : workers) {
    if (w.local_rank == failed_local_rank)
      out << "tandemrun: worker failed: " << describe_worker(w, grace_period_s) << "\n";
  }
  if (workers.size() > 1) out << "tandemrun: other workers:\n";
  for (const auto& w : workers) {
    if (w.local_rank != failed_local_rank)
      out << "tandemrun:   " << describe_worker(w, grace_period_s) << "\n";
  }
  write_all(2, out.str());
}

std::string describe_failure(const Worker& w, double heartbeat_timeout_s) {
  if (w.hung) {
    std::ostringstream text;
    text << "sent no heartbeat for " << static_cast<int>(w.silent_s) << " s (--heartbeat-timeout "
         << heartbeat_timeout_s << " s): hung";
    return text.str();
  }
  if (w.exit) return describe(*w.exit);
  return "did not exit";
}

FailureRecord record_failure(const Worker& failed, int restart_count, double heartbeat_timeout_s) {
  FailureRecord record;
  record.restart_count = restart_count;
  record.rank = failed.rank;
  record.pid = failed.pid;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) record.host = host;
  record.what = describe_failure(failed, heartbeat_timeout_s);
  if (!failed.error_file.empty()) record.error = launch::read_error_file(failed.error_file);
  record.final_reason = final_reason(failed.exit, record.error);
  return record;
}

void print_root_cause(const std::vector<FailureRecord>& failures, int max_restarts) {
  if (failures.empty()) return;
  std::ostringstream out;
  const FailureRecord& first = failures.front();
  out << "tandemrun: root cause (first failure): rank " << first.rank << " on host " << first.host
      << " (pid " << first.pid << "), restart " << first.restart_count << ": " << first.what
      << "\n";
  if (first.error) {
    out << "tandemrun:   error: " << first.error->message << "\n";
    if (first.error->timestamp > 0)
      out << "tandemrun:   error time: " << first.error->timestamp << " (unix seconds)\n";
  }
  if (failures.size() > 1) {
    out << "tandemrun: failures: " << failures.size() << " attempts (--max-restarts "
        << max_restarts << ")\n";
    for (const auto& f : failures) {
      out << "tandemrun:   restart " << f.restart_count << ": rank " << f.rank << " (pid " << f.pid
          << ") " << f.what;
      if (f.error) out << ": " << f.error->message;
      out << "\n";
    }
  }
  write_all(2, out.str());
}

int stop_on_signal(WorkerGroup& group, int signo, double grace_period_s) {
  log_line("received " + signal_name(signo) + "; forwarding it to the workers (SIGKILL after " +
           seconds_text(grace_period_s) + ")");
  group.stop(signo, std::chrono::milliseconds(std::llround(grace_period_s * 1000.0)));
  std::ostringstream out;
  out << "tandemrun: stopped by " << signal_name(signo) << "; workers:\n";
  for (const auto& w : group.workers())
    out << "tandemrun:   " << describe_worker(w, grace_period_s) << "\n";
  write_all(2, out.str());
  return 128 + signo;
}

}  // namespace tandem::launcher
