#include "tools/tandemrun/supervise/root_cause.h"

namespace tandem::launcher {

bool looks_secondary(const launch::ErrorReport& error) { return launch::is_consequence(error.kind); }

int root_cause_local_rank(const std::vector<Worker>& workers, int first_seen) {
  int best = -1;
  int best_order = 0;
  for (const auto& w : workers) {
    if (!w.failed_on_its_own() && w.local_rank != first_seen) continue;
    const auto error = launch::read_error_file(w.error_file);
    if (error && looks_secondary(*error)) continue;
    if (best < 0 || w.failure_order < best_order) {
      best = w.local_rank;
      best_order = w.failure_order;
    }
  }
  return best >= 0 ? best : first_seen;
}

std::string final_reason(const std::optional<WorkerExit>& exit,
                         const std::optional<launch::ErrorReport>& error) {
  if (exit && !exit->signaled && exit->code == launch::kExitFinal) return "a configuration error";
  if (!error || error->restartable) return "";
  switch (error->kind) {
    case launch::ErrorKind::kConfig:
      return "a configuration error";
    case launch::ErrorKind::kCheckpoint:
      return "a checkpoint error that trying again cannot fix";
    case launch::ErrorKind::kFile:
      return "a file error that trying again cannot fix";
    default:
      return std::string("an error of kind '") + launch::kind_name(error->kind) +
             "' that its program reports as not restartable";
  }
}

}  // namespace tandem::launcher
