#include "tools/tandemrun/launch/worker_env.h"

#include <map>

#include "base/launch_contract.h"

extern char** environ;  // POSIX; declared here because <unistd.h> hides it without _GNU_SOURCE

namespace tandem::launcher {
namespace {

bool has_key(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& entry : env) {
    if (entry.size() > key.size() && entry.compare(0, key.size(), key) == 0 &&
        entry[key.size()] == '=')
      return true;
  }
  return false;
}

}  // namespace

std::string ft_keys(const LauncherOptions& options, int restart_count) {
  return launch::ft_prefix(options.run_id, restart_count);
}

int global_rank(const LauncherOptions& options, int local_rank) {
  return options.node_rank * options.nproc_per_node + local_rank;
}

bool omp_threads_defaulted(const LauncherOptions& options,
                           const std::vector<std::string>& base_env) {
  return options.nproc_per_node > 1 && !has_key(base_env, "OMP_NUM_THREADS");
}

std::vector<std::string> build_worker_env(const LauncherOptions& options, const WorkerSlot& slot,
                                          const std::vector<std::string>& base_env) {
  const int rank = global_rank(options, slot.local_rank);
  // Ordered map so every worker's environment lists the variables in the same order.
  std::map<std::string, std::string> vars = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(slot.local_rank)},
      {"WORLD_SIZE", std::to_string(options.world_size())},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(options.world_size())},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(slot.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts)},
      {"TORCHELASTIC_RUN_ID", options.run_id},
      // Without --ft tandemrun hosts no store and rank 0 creates it (torchrun's agent mode is
      // "True"); with --ft it serves the store, which must outlive any worker.
      {"TORCHELASTIC_USE_AGENT_STORE", options.ft ? "True" : "False"},
  };
  if (omp_threads_defaulted(options, base_env)) vars["OMP_NUM_THREADS"] = "1";
  // Per-worker channels; an inherited value would point every worker at the same file.
  const std::map<std::string, std::string> channels = {
      {launch::kEnvErrorFile, slot.error_file}, {launch::kEnvHeartbeatFile, slot.heartbeat_file},
      {launch::kEnvFlightRecorderDir, slot.flight_dir}, {launch::kEnvMetricsFile, slot.metrics_file},
      {launch::kEnvFtKeys, options.ft ? ft_keys(options, slot.restart_count) : std::string()},
      {launch::kEnvReplacement, slot.incarnation > 0 ? std::to_string(slot.incarnation) : std::string()}};

  std::vector<std::string> env;
  env.reserve(base_env.size() + vars.size());
  for (const auto& entry : base_env) {
    const auto eq = entry.find('=');
    if (eq != std::string::npos &&
        (vars.count(entry.substr(0, eq)) > 0 || channels.count(entry.substr(0, eq)) > 0))
      continue;  // replaced (or removed) below
    env.push_back(entry);
  }
  for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
  for (const auto& [key, value] : channels) {
    if (!value.empty()) env.push_back(key + "=" + value);
  }
  return env;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

}  // namespace tandem::launcher
