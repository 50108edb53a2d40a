#include "tools/tandemrun/root_cause.h"

namespace tandem::launcher {

bool looks_secondary(const WorkerError& error) {
  for (const char* prefix : {"tandem::CommError:", "tandem::TimeoutError:"}) {
    if (error.message.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

int root_cause_local_rank(const std::vector<Worker>& workers, int first_seen) {
  int best = -1;
  int best_order = 0;
  for (const auto& w : workers) {
    if (!w.failed_on_its_own() && w.local_rank != first_seen) continue;
    const auto error = read_error_file(w.error_file);
    if (error && looks_secondary(*error)) continue;
    if (best < 0 || w.failure_order < best_order) {
      best = w.local_rank;
      best_order = w.failure_order;
    }
  }
  return best >= 0 ? best : first_seen;
}

}  // namespace tandem::launcher
