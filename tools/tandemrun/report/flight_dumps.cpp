// tandemrun's part of the flight recorder (tools/tandemrun/report/flight_dumps.h).
#include "tools/tandemrun/report/flight_dumps.h"

#include <tandem/collectives/flight_ring.h>

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace tandem::launcher {

std::string flight_dir(const std::string& log_dir, const std::string& run_id, int restart_count) {
  const std::string attempt = "attempt_" + std::to_string(restart_count);
  if (!log_dir.empty()) return log_dir + "/flight/" + attempt;
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandem-flight-" + run_id + "/" + attempt;
}

bool catches_sigusr1(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (mask >> (10 - 1)) & 1ULL;  // SIGUSR1 is 10: bit 9
  }
  return false;
}

int count_flight_dumps(const std::string& dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("flight_rank", 0) == 0 && name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) ++n;
    }
    ::closedir(d);
  }
  return n;
}

std::string dump_stopped_worker(pid_t pid, int rank, const std::string& dir) {
  const std::string who = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
  const std::string ring = find_flight_ring(pid);
  if (ring.empty()) return "";
  try {
    const FlightSnapshot s = read_flight_ring(ring);
    // Only the worker's own record: not a ring another process made and passed down to it.
    if (s.pid != pid || s.rank != rank) {
      return who + " is stopped; its flight-recorder ring belongs to rank " +
             std::to_string(s.rank) + ", pid " + std::to_string(s.pid) + ": not dumped";
    }
    const std::string path = dir + "/flight_rank" + std::to_string(rank) + ".json";
    std::string error;
    if (!write_flight_dump(s, "stopped", path, &error)) {
      return who + " is stopped; writing its flight record to " + path + " failed: " + error;
    }
    std::string line =
        who + " is stopped (SIGSTOP or a debugger): tandemrun read its flight record itself (" +
        std::to_string(s.entries.size()) + " ops) into " + path;
    if (!s.torn.empty()) {
      line += "; " + std::to_string(s.torn.size()) +
              (s.torn.size() == 1 ? " entry was" : " entries were") +
              " being written when it stopped: left out, listed as \"torn\"";
    }
    return line;
  } catch (const std::exception& e) {
    return who + " is stopped; its flight record could not be read: " + e.what();
  }
}

}  // namespace tandem::launcher
