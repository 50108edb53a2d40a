#include "run_summary.h"

#include <signal.h>

#include <sstream>

#include "fd_io.h"

namespace tandem::launcher {

std::string describe_worker(const Worker& w, double grace_period_s) {
  std::ostringstream line;
  line << "rank " << w.rank << " (pid " << w.pid << ") ";
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

void print_interrupt_summary(const std::vector<Worker>& workers, int signo, double grace_period_s) {
  std::ostringstream out;
  out << "tandemrun: stopped by " << signal_name(signo) << "; workers:\n";
  for (const auto& w : workers)
    out << "tandemrun:   " << describe_worker(w, grace_period_s) << "\n";
  write_all(2, out.str());
}

}  // namespace tandem::launcher
