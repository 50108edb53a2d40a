#include "tools/tandemrun/root_cause.h"

#include "base/strings.h"

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

std::string final_reason(const std::optional<WorkerExit>& exit,
                         const std::optional<WorkerError>& error) {
  if (exit && !exit->signaled && exit->code == 2) return "a configuration error";
  if (!error) return "";
  const std::string& m = error->message;
  const std::string type = m.substr(0, m.find(": "));
  if (strings::ends_with(type, "ConfigError")) return "a configuration error";
  if (type != "tandem::CheckpointError") return "";
  if (strings::starts_with(m, "tandem::CheckpointError: tandem: checkpoint: cannot resume:"))
    return "a checkpoint this run cannot resume from";
  // The errno texts of a directory that will not become writable by trying again.
  for (const char* cause : {"Permission denied", "Operation not permitted", "Read-only file system",
                            "Not a directory", "exists and is not a directory"}) {
    if (m.find(cause) != std::string::npos) return "a checkpoint directory that cannot be written";
  }
  return "";
}

}  // namespace tandem::launcher
